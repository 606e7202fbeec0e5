"""Leased shard claims, so several nodes can share one dataset root without a coordinator.

Design: a claim is a sequence of generation files `claims/shard-000042.<n>.json`, each
created with `Storage.create_exclusive`, and the highest `n` is the live record. Every change
(first claim, takeover of an expired lease, renewal, release) creates generation `n + 1`,
never rewrites one, so each change is a single atomic create-if-absent: of any number of
racers that read generation `n`, exactly one creates `n + 1` and the others see it existed.
This works on a local directory (link) and on S3 (`If-None-Match: *`) alike; overwriting one
claim object in place could not be made atomic against a racer on S3.

A record holds the node and `expires_at` (the `clock`, seconds since the epoch). Leases rest
on clocks agreeing to well within `lease_s`; a node that stalls past its lease may be taken
over, so it must call `owns` right before it commits a shard (the fence), and `renew` raises
`ClaimLost` once another node has a newer generation. Node names must be unique per process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from regen.storage import Storage

PREFIX = "claims/"


class ClaimLost(RuntimeError):
    """Another node holds the newest claim on a shard this node thought it held."""


@dataclass(frozen=True)
class Claim:
    """One generation of a shard's claim; `node` is None for a release."""

    generation: int
    node: str | None
    expires_at: float


def _stem(shard: int) -> str:
    return f"{PREFIX}shard-{shard:06d}."


def _key(shard: int, generation: int) -> str:
    # Zero-padded so the sorted listing is in generation order too.
    return f"{_stem(shard)}{generation:09d}.json"


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
        keys = self.storage.list(_stem(shard))
        if not keys:
            return None
        record = json.loads(self.storage.read_bytes(keys[-1]))
        return Claim(int(record["generation"]), record["node"], float(record["expires_at"]))

    def _create(self, shard: int, generation: int, node: str | None, expires_at: float) -> bool:
        body = {"generation": generation, "node": node, "expires_at": expires_at}
        return self.storage.create_exclusive(
            _key(shard, generation), json.dumps(body, sort_keys=True).encode()
        )

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

    def owns(self, shard: int) -> bool:
        """Whether this node holds a live lease now: check right before committing the shard."""
        current = self.latest(shard)
        return self._live(current) and current is not None and current.node == self.node

    def release(self, shard: int) -> None:
        """Give the shard up early, so others need not wait out the lease; no-op if not held."""
        current = self.latest(shard)
        if current is None or current.node != self.node:
            return
        # Losing this race means another node already took over: nothing left to release.
        self._create(shard, current.generation + 1, None, 0.0)

    def holder(self, shard: int) -> str | None:
        """The node holding a live lease on the shard, or None."""
        current = self.latest(shard)
        return current.node if self._live(current) and current is not None else None
