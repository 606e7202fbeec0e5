"""A node's hold on the shards it generates, and how many it should hold at once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from regen.claims import LeaseKeeper, ShardClaims


@dataclass(frozen=True)
class Lease:
    """A node's hold on the shards it generates: the fence checked before each commit."""

    claims: ShardClaims
    keeper: LeaseKeeper

    @property
    def node(self) -> str:
        return self.claims.node

    def held(self, shard: int) -> bool:
        """Whether a third of the lease is left: enough for any commit to finish inside it."""
        return not self.keeper.lost(shard) and self.claims.owns(shard, self.claims.lease_s / 3)


def shards_in_flight(slots: int, shard_size: int) -> int:
    """Enough claimed shards to keep every slot busy past a shard's stragglers, and no more.

    A shard stays open until its longest answer ends, so the slots (servers x concurrency)
    need twice their number of rows queued plus two shards behind; each claimed shard beyond
    that is one fewer for a faster node to take over.
    """
    return max(4, math.ceil(2 * slots / shard_size) + 2)
