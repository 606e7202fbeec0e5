"""Leased shard claims, so several nodes can share one dataset root without a coordinator.

Design: a claim is a sequence of generation files `claims/shard-000042.<n>.json` (keys of
`regen.dataset.keys`), each
created with `Storage.create_exclusive`, and the highest `n` is the live record. Every change
(first claim, takeover of an expired lease, renewal, release) creates generation `n + 1`,
never rewrites one, so each change is a single atomic create-if-absent: of any number of
racers that read generation `n`, exactly one creates `n + 1` and the others see it existed.
This works on a local directory (link) and on S3 (`If-None-Match: *`) alike; overwriting one
claim object in place could not be made atomic against a racer on S3.

A record holds the node and `expires_at` (the `clock`, seconds since the epoch). Leases rest
on clocks agreeing to well within `lease_s`; a node that stalls past its lease may be taken
over, so it must call `owns` right before it commits a shard (the fence, with a margin so the
lease cannot run out during the commit), and `renew` raises `ClaimLost` once another node has a
newer generation. Node names must be unique per process.

Generations older than the one just superseded are deleted after each change: a listing then
holds at most three keys per shard however often a lease is renewed, and the newest two are
never deleted, so no racer can recreate a generation that existed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from regen.dataset.keys import (
    CLAIMS_PREFIX,
    claim_key,
    claim_prefix,
    heartbeat_key,
    parse_claim_key,
)
from regen.machine.ticker import Ticker
from regen.storage import Storage


class ClaimLost(RuntimeError):
    """Another node holds the newest claim on a shard this node thought it held."""


@dataclass(frozen=True)
class Claim:
    """One generation of a shard's claim; `node` is None for a release."""

    generation: int
    node: str | None
    expires_at: float


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

    def latest(self, shard: int) -> Claim | None:
        """The live (highest) generation, or None if the shard was never claimed."""
        keys = self.storage.list(claim_prefix(shard))
        if not keys:
            return None
        record = json.loads(self.storage.read_bytes(keys[-1]))
        return Claim(int(record["generation"]), record["node"], float(record["expires_at"]))

    def _create(self, shard: int, generation: int, node: str | None, expires_at: float) -> bool:
        body = {"generation": generation, "node": node, "expires_at": expires_at}
        created = self.storage.create_exclusive(
            claim_key(shard, generation), json.dumps(body, sort_keys=True).encode()
        )
        if created:
            self._prune(shard, generation)
        return created

    def _prune(self, shard: int, newest: int) -> None:
        for key in self.storage.list(claim_prefix(shard)):
            parsed = parse_claim_key(key)
            if parsed is not None and parsed[1] < newest - 1:
                self.storage.delete(key)

    def _live(self, claim: Claim | None) -> bool:
        return claim is not None and claim.node is not None and claim.expires_at > self.clock()

    def claim(self, shard: int) -> bool:
        """Take the shard if unclaimed, released or expired; True if this node now holds it."""
        current = self.latest(shard)
        if self._live(current):
            assert current is not None
            return current.node == self.node
        generation = 0 if current is None else current.generation + 1
        return self._create(shard, generation, self.node, self.clock() + self.lease_s)

    def renew(self, shard: int) -> None:
        """Extend this node's lease by `lease_s` from now; ClaimLost if another node took it."""
        current = self.latest(shard)
        if current is None or current.node != self.node:
            raise ClaimLost(f"shard {shard}: held by {current.node if current else 'nobody'}")
        if not self._create(shard, current.generation + 1, self.node, self.clock() + self.lease_s):
            raise ClaimLost(f"shard {shard}: taken over while renewing")

    def owns(self, shard: int, margin_s: float = 0.0) -> bool:
        """Whether this node holds a lease with `margin_s` left: check right before committing."""
        current = self.latest(shard)
        return (
            current is not None
            and current.node == self.node
            and current.expires_at - margin_s > self.clock()
        )

    def release(self, shard: int) -> None:
        """Give the shard up early, so others need not wait out the lease; no-op if not held."""
        current = self.latest(shard)
        if current is None or current.node != self.node:
            return
        # Losing this race means another node already took over: nothing left to release.
        self._create(shard, current.generation + 1, None, 0.0)


class LeaseKeeper:
    """Renews this node's claims from a thread, and says which ones it lost.

    Renewing every third of the lease leaves two renewals of slack before a lease can run
    out. Each round also writes `nodes/<node>.json`, the node's heartbeat, which the parent
    reads to tell a node that is working from one that vanished with its process.
    """

    def __init__(self, claims: ShardClaims, info: dict[str, str] | None = None) -> None:
        self.claims = claims
        self.info = dict(info or {})
        self._held: set[int] = set()
        self._lost: set[int] = set()
        self._lock = threading.Lock()
        # A storage hiccup fails one round; the next retries it, and the fence still holds.
        self._ticker = Ticker("lease-keeper", claims.lease_s / 3, self.renew_all)

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
