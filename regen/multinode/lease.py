"""A node's hold on the shards it generates: the fence checked before each commit."""

from __future__ import annotations

from dataclasses import dataclass

from regen.multinode.claims import LeaseKeeper, ShardClaims


@dataclass(frozen=True)
class Lease:
    """A node's hold on the shards it generates (a `regen.generation.shard.Fence`)."""

    claims: ShardClaims
    keeper: LeaseKeeper

    @property
    def node(self) -> str:
        return self.claims.node

    def held(self, shard: int) -> bool:
        """Whether the node holds the shard for a commit: its keeper lost nothing, and the
        claim passes the lease protocol's fence (a third of the lease left)."""
        return not self.keeper.lost(shard) and self.claims.fence(shard)
