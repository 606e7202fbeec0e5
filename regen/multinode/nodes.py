"""The nodes of a multi-node run: what each one is, and which shards it starts with.

A node is one GPU machine with a Prefect worker on its own work pool. The parent run gives
every node a contiguous range of the pending shards, sized by the node's weight; the ranges
only decide where each node starts. Which node generates a shard in the end is settled by
claims on the shared storage (`regen.multinode.claims`, `regen.multinode.balance`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from regen.config import RegenConfig, parse_config
from regen.dataset import Manifest, read_committed
from regen.errors import ConfigError
from regen.multinode.claims import read_heartbeat
from regen.storage import Storage


class NodeConfig(BaseModel):
    """One GPU node: its name, its deployment, and how its fleet differs from the run's.

    Only fleet settings can differ: sampling, model and prompts are the run's, so every node
    writes shards of the one fingerprint.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="e.g. node-1")
    deployment: str | None = Field(
        default=None, description="flow/deployment to run; default regenerate/<name>."
    )
    weight: float | None = Field(
        default=None, gt=0, description="Relative speed for the first split; default its GPUs."
    )
    fleet_block: str | None = Field(default=None, description="FleetConfig block of this node.")
    engine: dict[str, Any] = Field(
        default_factory=dict, description="Keys of `engine` that differ on this node (gpus...)."
    )
    work_dir: str | None = None
    stage_dir: str | None = None
    concurrency_per_server: int | None = Field(default=None, gt=0)

    @property
    def deployment_name(self) -> str:
        return self.deployment or f"regenerate/{self.name}"

    def config_data(self, run: RegenConfig) -> dict[str, Any]:
        """The run's config as the user gave it, this node's fleet settings merged in.

        Only what was set is passed on, so defaults that depend on the machine (the engine's
        interpreter) resolve on the node, not where the parent runs. The API key never travels
        in parameters: a node takes it from its secret block or makes its own.
        """
        data = run.model_dump(mode="json", exclude_unset=True)
        data.get("engine", {}).pop("api_key", None)
        if self.engine:
            data["engine"] = _merge(data.get("engine", {}), self.engine)
        if self.work_dir is not None:
            data["work_dir"] = self.work_dir
        if self.stage_dir is not None:
            data.setdefault("model", {})["stage_dir"] = self.stage_dir
        if self.concurrency_per_server is not None:
            data["concurrency_per_server"] = self.concurrency_per_server
        return data


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class NodeAssignment(BaseModel):
    """What a child run needs to know of the whole run: every node's starting range."""

    name: str
    ranges: dict[str, list[int]]
    weights: dict[str, float]
    lease_s: float = Field(gt=0)
    lease_run: str | None = None
    """The parent's run id, whose lease on the output (`regen.storage.output_lease`) the node
    shares."""


def check_nodes(run: RegenConfig, nodes: list[NodeConfig]) -> dict[str, RegenConfig]:
    """Each node's parsed config, so a bad node setting fails before any node starts."""
    if run.generation.retry_errors:
        # The children claim only shards without a manifest, so the flag would be ignored.
        raise ConfigError(
            "generation.retry_errors: not supported by a multi-node run; retry the error rows "
            "with a single-node run (the `regenerate` flow) on the same output"
        )
    if not nodes:
        raise ConfigError("nodes: a multi-node run needs at least one node")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ConfigError(f"nodes: a node name appears twice: {names}")
    configs = {}
    for i, node in enumerate(nodes):
        data = node.config_data(run)
        if run.engine.api_key is not None:  # checked with the key the node will load itself
            data.setdefault("engine", {})["api_key"] = run.engine.api_key.get_secret_value()
        configs[node.name] = parse_config(data, f"nodes[{i}] ({node.name})")
    return configs


def node_weights(nodes: list[NodeConfig], configs: dict[str, RegenConfig]) -> dict[str, float]:
    """A node's weight, or its server count: a 7-GPU node starts with 7/4 of a 4-GPU one's."""
    return {n.name: n.weight or float(configs[n.name].engine.num_servers) for n in nodes}


def split_ranges(pending: list[int], weights: dict[str, float]) -> dict[str, list[int]]:
    """Contiguous runs of `pending`, one per node in the given order, sized by weight."""
    total = sum(weights.values())
    ranges: dict[str, list[int]] = {}
    start, acc = 0, 0.0
    for name, weight in weights.items():
        acc += weight
        stop = round(len(pending) * acc / total)
        ranges[name] = pending[start:stop]
        start = stop
    return ranges


class NodeTally:
    """What the nodes have committed so far, read incrementally from the manifests.

    A committed manifest never changes within a multi-node run (it refuses retry_errors), so
    each is read once: a poll costs one listing plus the manifests new since the last one.
    """

    def __init__(self, storage: Storage, fingerprint: str, num_shards: int) -> None:
        self.storage = storage
        self.fingerprint = fingerprint
        self.num_shards = num_shards
        self.manifests: dict[int, Manifest] = {}

    def refresh(self) -> NodeTally:
        found = read_committed(self.storage, self.fingerprint, known=self.manifests)
        self.manifests = found.manifests
        return self

    @property
    def complete(self) -> bool:
        return len(self.manifests) >= self.num_shards

    @property
    def rows(self) -> int:
        return sum(m.rows for m in self.manifests.values())

    def by_node(self) -> dict[str, tuple[int, int]]:
        """(shards, rows) committed per node; shards of earlier single-node runs count as ''."""
        out: dict[str, tuple[int, int]] = {}
        for m in self.manifests.values():
            shards, rows = out.get(m.node or "", (0, 0))
            out[m.node or ""] = (shards + 1, rows + m.rows)
        return out


def heartbeat_age(storage: Storage, node: str, now: float) -> float | None:
    """Seconds since the node's last heartbeat; None if it never beat or said it was done."""
    beat = read_heartbeat(storage, node)
    if beat is None or beat.get("done"):
        return None
    return now - float(str(beat["at"]))
