"""Leased shard claims, so several nodes can share one dataset root without a coordinator.

A shard's claim is `regen.storage.lease`'s protocol on the records
`claims/shard-000042.<n>.json` (keys of `regen.dataset.keys`), the one the output's lease uses
too: one expiry rule, one race handling, one fence. A record is a node's by its name (node
names must be unique per run); a node that stalls past its lease may be taken over, so it
passes the fence right before it commits a shard (`fence`: a third of the lease left, renewed
first when less is), and `renew` raises `ClaimLost` once another node has a newer generation.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from regen.dataset.keys import (
    CLAIMS_PREFIX,
    claim_key,
    claim_prefix,
    heartbeat_key,
    parse_claim_key,
)
from regen.machine.ticker import Ticker
from regen.storage import Storage
from regen.storage.lease import (
    FENCE_SHARE,
    GenerationLease,
    Holder,
    LeaseContended,
    LeaseRecord,
    Mine,
)


class ClaimLost(RuntimeError):
    """Another node holds the newest claim on a shard this node thought it held."""


def started_shards(storage: Storage) -> set[int]:
    """Shards some node has ever claimed (a released or expired claim still counts)."""
    keys = storage.list(CLAIMS_PREFIX)
    return {parsed[0] for key in keys if (parsed := parse_claim_key(key)) is not None}


class ShardClaims:
    """This node's view of shard claims on one storage root."""

    def __init__(
        self,
        storage: Storage,
        node: str,
        lease_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self.storage = storage
        self.node = node
        self.lease_s = lease_s
        self.clock = clock
        self.holder = Holder.this_process(node=node)
        self._mine: Mine = lambda holder: holder.node == node

    def _lease(self, shard: int) -> GenerationLease:
        def generation(key: str) -> int | None:
            parsed = parse_claim_key(key)
            return parsed[1] if parsed is not None and parsed[0] == shard else None

        return GenerationLease(
            self.storage,
            claim_prefix(shard),
            lambda n: claim_key(shard, n),
            generation,
            lease_s=self.lease_s,
            clock=self.clock,
        )

    def latest(self, shard: int) -> LeaseRecord | None:
        """The live (highest) generation, or None if the shard was never claimed."""
        return self._lease(shard).latest()

    def claim(self, shard: int) -> bool:
        """Take the shard if unclaimed, released or its holder dead; True if this node now
        holds it (claiming again what it holds renews it)."""
        try:
            held, _ = self._lease(shard).acquire(self.holder, self._mine)
        except LeaseContended:
            return False
        return held

    def renew(self, shard: int) -> None:
        """Extend this node's lease by `lease_s` from now; ClaimLost if another node took it."""
        try:
            renewed, current = self._lease(shard).renew(self.holder, self._mine)
        except LeaseContended:  # changed hands while renewing: whose it is now says
            current = self.latest(shard)
            holder = current.holder if current is not None else None
            renewed = holder is not None and self._mine(holder)
        if not renewed:
            holder = current.holder if current is not None else None
            raise ClaimLost(f"shard {shard}: held by {holder.node if holder else 'nobody'}")

    def owns(self, shard: int, margin_s: float = 0.0) -> bool:
        """Whether this node holds a lease with more than `margin_s` left."""
        return self._lease(shard).holds(self._mine, margin_s)

    def fence(self, shard: int) -> bool:
        """Right before committing: whether this node holds the shard for the commit
        (`GenerationLease.fence`: a third of the lease left, renewed first when less is)."""
        try:
            return self._lease(shard).fence(self._mine)[0]
        except LeaseContended:
            return False

    def release(self, shard: int) -> None:
        """Give the shard up early, so others need not wait out the lease; no-op if not held."""
        self._lease(shard).release(self._mine)


class LeaseKeeper:
    """Renews this node's claims from a thread, and says which ones it lost.

    Renewing every third of the lease (`FENCE_SHARE`) leaves two renewals of slack before a
    lease can run out. Each round also writes `nodes/<node>.json`, the node's heartbeat, which
    the parent reads to tell a node that is working from one that vanished with its process.
    """

    def __init__(self, claims: ShardClaims, info: dict[str, str] | None = None) -> None:
        self.claims = claims
        self.info = dict(info or {})
        self._held: set[int] = set()
        self._lost: set[int] = set()
        self._lock = threading.Lock()
        # A storage hiccup fails one round; the next retries it, and the fence still holds.
        self._ticker = Ticker("lease-keeper", claims.lease_s * FENCE_SHARE, self.renew_all)

    def __enter__(self) -> LeaseKeeper:
        self.beat()
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ticker.stop()
        self.info["done"] = "true"  # a finished node is not a vanished one: no more beats
        self.beat()

    def hold(self, shard: int) -> None:
        with self._lock:
            self._held.add(shard)
            self._lost.discard(shard)

    def drop(self, shard: int) -> None:
        with self._lock:
            self._held.discard(shard)

    def lost(self, shard: int) -> bool:
        with self._lock:
            return shard in self._lost

    def beat(self) -> None:
        """Write the heartbeat now."""
        with self._lock:
            held = sorted(self._held)
        body = {"node": self.claims.node, "at": self.claims.clock(), "held": held, **self.info}
        self.claims.storage.write_bytes(heartbeat_key(self.claims.node), json.dumps(body).encode())

    def renew_all(self) -> None:
        """One round: renew every held claim, mark the ones another node took."""
        with self._lock:
            held = sorted(self._held)
        for shard in held:
            try:
                self.claims.renew(shard)
            except ClaimLost:
                with self._lock:
                    self._held.discard(shard)
                    self._lost.add(shard)
        self.beat()


def read_heartbeat(storage: Storage, node: str) -> dict[str, object] | None:
    """A node's last heartbeat (`at` in seconds since the epoch), or None if it never beat."""
    try:
        return dict(json.loads(storage.read_bytes(heartbeat_key(node))))
    except FileNotFoundError:
        return None
