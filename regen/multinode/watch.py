"""The parent's decisions in a multi-node run: when to stop watching, which nodes vanished,
and what to say of each node at the end.

The parent never waits on one child: it watches the shared dataset (manifests, heartbeats)
and the children's states together, so a node that vanished with its process is reported
instead of waited on forever. Reading and setting flow-run states is the caller's (Prefect's
client); here a child's state is a plain `ChildState`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from regen.config import RegenConfig
from regen.display.figures import markdown_table
from regen.multinode.nodes import NodeAssignment, NodeConfig, NodeTally, heartbeat_age
from regen.storage import Storage


@dataclass(frozen=True)
class ChildState:
    """What the parent needs of a child run's state."""

    name: str | None
    message: str | None
    final: bool
    completed: bool
    running: bool


class NodeOutcome(BaseModel):
    """One node's part in the run, as the parent saw it end."""

    name: str
    flow_run_id: str
    state: str
    shards: int
    rows: int
    problem: str | None = None
    note: str | None = None

    def summary(self) -> str:
        """One log line."""
        return (
            f"node {self.name}: {self.state}, {self.shards} shard(s), {self.rows} rows "
            f"{self.problem or self.note or ''}"
        )


class NodesReport(BaseModel):
    complete: bool
    nodes: list[NodeOutcome]

    @property
    def failed(self) -> list[str]:
        return [n.name for n in self.nodes if n.problem]

    def headline(self) -> str:
        failed = f", failed: {', '.join(self.failed)}" if self.failed else ""
        return f"{len(self.nodes)} node(s){failed}"

    def to_markdown(self) -> str:
        lines = markdown_table(
            ["node", "flow run state", "shards", "rows", "problem"],
            ((n.name, n.state, n.shards, n.rows, n.problem or n.note or "") for n in self.nodes),
            numeric={"shards", "rows"},
        )
        verdict = "complete" if self.complete else "INCOMPLETE: run again to resume"
        return f"## Nodes\n\ndataset {verdict}\n\n" + "\n".join(lines) + "\n"


def child_parameters(
    node: NodeConfig,
    config: RegenConfig,
    assignment: NodeAssignment,
    blocks: dict[str, str | None],
) -> dict[str, Any]:
    """A child run's parameters: the run's config with the node's fleet settings, its
    assignment, and the blocks (by name: each node loads its secrets itself)."""
    parameters: dict[str, Any] = {
        "config": node.config_data(config),
        "node": assignment.model_dump(mode="json"),
        "fleet_block": node.fleet_block,
        **blocks,
    }
    return {k: v for k, v in parameters.items() if v is not None}


def problem(state: ChildState | None, age: float | None, lease_s: float) -> str | None:
    """Why a node failed: it ended other than Completed, or it is still Running but its
    heartbeat is older than a lease (its worker or machine died)."""
    if state is None:
        return None
    if state.final:
        return None if state.completed else f"{state.name}: {state.message or ''}".strip()
    if age is not None and age > lease_s:
        return f"vanished: no heartbeat for {age:.0f} s"
    return None


@dataclass(frozen=True)
class Watched:
    """The last look at the run: the tally, every child's state and heartbeat age."""

    tally: NodeTally
    states: dict[str, ChildState | None]
    ages: dict[str, float | None]


def watch(
    storage: Storage,
    fingerprint: str,
    num_shards: int,
    read_states: Callable[[], dict[str, ChildState | None]],
    *,
    lease_s: float,
    poll_s: float,
    on_poll: Callable[[NodeTally], None] | None = None,
) -> Watched:
    """Poll until every shard is committed or no node is left working.

    Once the dataset is complete, nodes still winding down get a lease to end on their own.
    """
    tally = NodeTally(storage, fingerprint, num_shards)
    done_since: float | None = None
    while True:
        tally.refresh()
        if on_poll is not None:
            on_poll(tally)
        states = read_states()
        now = time.time()
        ages = {name: heartbeat_age(storage, name, now) for name in states}
        working = [
            name
            for name, state in states.items()
            if state is not None and not state.final and problem(state, ages[name], lease_s) is None
        ]
        if tally.complete:
            done_since = done_since or time.monotonic()
            if not working or time.monotonic() - done_since > lease_s:
                return Watched(tally, states, ages)
        elif not working:
            return Watched(tally, states, ages)
        time.sleep(poll_s)


Stop = Literal["crashed", "cancelling", "cancelled"]


@dataclass(frozen=True)
class NodeEnd:
    """A node's problem or note, and the state to force on its run if it is not final."""

    problem: str | None
    note: str | None
    stop: Stop | None


NOT_NEEDED = "not needed: the other nodes finished the dataset"


def node_end(watched: Watched, name: str, lease_s: float) -> NodeEnd:
    """A child still Running whose heartbeat went stale is to be marked Crashed, and one
    never needed once the others finished the dataset Cancelled (Cancelling if it runs, so
    its worker stops it), so the UI shows what happened to each node."""
    state = watched.states[name]
    found = problem(state, watched.ages[name], lease_s)
    if state is None or state.final:
        return NodeEnd(found, None, None)
    if found is not None:
        return NodeEnd(found, None, "crashed")
    if watched.tally.complete:
        return NodeEnd(None, NOT_NEEDED, "cancelling" if state.running else "cancelled")
    return NodeEnd(None, None, None)


def outcome(watched: Watched, node: str, flow_run_id: str, state: str, end: NodeEnd) -> NodeOutcome:
    """The node's line of the report: its end state (after any `end.stop` was set)."""
    shards, rows = watched.tally.by_node().get(node, (0, 0))
    return NodeOutcome(
        name=node,
        flow_run_id=flow_run_id,
        state=state,
        shards=shards,
        rows=rows,
        problem=end.problem,
        note=end.note,
    )
