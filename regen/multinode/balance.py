"""Which shard a node of a multi-node run takes next, so fast nodes end up with more of them.

Order: the node's own range, front to back; then shards nobody started, taken from the back
of the range of the node with the most such work left per unit of weight (the slowest, or
the one that started last), where its owner would reach them last; then shards whose lease
ran out (a dead node's) or was released. Every pick is a claim (`ShardClaims.claim`), so two
nodes never hold one shard, and a claimed shard whose manifest already exists is handed back.
"""

from __future__ import annotations

from collections.abc import Iterator

from regen.dataset import manifested_shards, read_manifest
from regen.multinode.claims import ShardClaims, started_shards


class ShardPicker:
    """One node's side of the balance; not thread-safe (the node's scheduling loop owns it)."""

    def __init__(
        self,
        claims: ShardClaims,
        ranges: dict[str, list[int]],
        weights: dict[str, float],
        fingerprint: str,
    ) -> None:
        self.claims = claims
        self.ranges = ranges
        self.weights = weights
        self.fingerprint = fingerprint
        self.shards = sorted({s for r in ranges.values() for s in r})
        self.mine: set[int] = set()
        self.given_up: set[int] = set()

    @property
    def node(self) -> str:
        return self.claims.node

    def next(self) -> int | None:
        """Claim and return the next shard to generate, or None if none is free right now."""
        done = manifested_shards(self.claims.storage)
        started = started_shards(self.claims.storage)
        for shard in self._candidates(done, started):
            if self._take(shard):
                return shard
        return None

    def finish(self, shard: int, *, failed: bool) -> None:
        """The shard's task ended: committed, lost, or failed for good on this node."""
        self.mine.discard(shard)
        if failed:
            self.given_up.add(shard)
            self.claims.release(shard)

    def outstanding(self) -> list[int]:
        """Shards of the run not committed, not in hand here and not given up: others' work."""
        done = manifested_shards(self.claims.storage)
        skip = done | self.mine | self.given_up
        return [s for s in self.shards if s not in skip]

    def _candidates(self, done: set[int], started: set[int]) -> Iterator[int]:
        skip = done | self.mine | self.given_up
        own = self.ranges.get(self.node, [])
        yield from (s for s in own if s not in skip and s not in started)
        unstarted = {
            name: [s for s in shards if s not in skip and s not in started]
            for name, shards in self.ranges.items()
            if name != self.node
        }
        while any(unstarted.values()):
            slowest = max(
                (n for n, left in unstarted.items() if left),
                key=lambda n: len(unstarted[n]) / self.weights.get(n, 1.0),
            )
            yield unstarted[slowest].pop()
        yield from (s for s in self.shards if s in started and s not in skip)

    def _take(self, shard: int) -> bool:
        if not self.claims.claim(shard):
            return False
        # The previous holder may have committed and released between our listing and claim.
        manifest = read_manifest(self.claims.storage, shard)
        if manifest is not None and manifest.fingerprint == self.fingerprint:
            self.claims.release(shard)
            return False
        self.mine.add(shard)
        return True
