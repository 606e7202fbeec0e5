"""Multi-node runs: what the parent knows of each GPU node, and what it hands each child.

A node is reached only through its Prefect work pool `regen-gpu-<name>`; the library never
talks to Prefect, so these are plain models the parent flow passes as child parameters.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from regen.config import EngineConfig

NODE_NAME = r"^[a-z0-9][a-z0-9-]{0,40}$"


class NodeConfig(BaseModel):
    """One GPU node of a multi-node run: its work pool and its own fleet."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NODE_NAME, description="Work pool and deployment: regen-gpu-<name>.")
    engine: EngineConfig | None = Field(
        default=None, description="This node's fleet (GPUs, ports); default: the run's engine."
    )
    weight: float | None = Field(
        default=None, gt=0, description="Share of the first split; default: its number of GPUs."
    )


class NodeAssignment(BaseModel):
    """A child run's part: the shards it starts with and how long its claims stay valid.

    `shards` uses the `generation.shards` syntax (`start:stop`). A child generates its own
    range first, then takes unstarted shards of other nodes, then expired claims, and ends
    when every shard of the plan is committed.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NODE_NAME)
    shards: str = Field(pattern=r"^\d*:\d*$")
    lease_s: float = Field(default=120.0, gt=0)

    @property
    def pool(self) -> str:
        return f"regen-gpu-{self.name}"
