"""The parent's side of a multi-node run: start one child run per node, watch them, report.

Children are runs of each node's deployment, started from the parent's flow so the UI shows
them as its subflows; `regen.multinode.watch` decides what they get, when the watch ends
and what became of each node; here the runs' states are read and set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NONE
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.states import Cancelled, Cancelling, Crashed, State

from regen.config import RegenConfig
from regen.display.figures import pct
from regen.display.naming import artifact, described
from regen.generation.run_plan import RunPlan
from regen.multinode.nodes import NodeAssignment, NodeConfig, NodeTally
from regen.multinode.watch import (
    ChildState,
    NodesReport,
    child_parameters,
    node_end,
    outcome,
    watch,
)
from regen.run import OpenedRun

_STOPS: dict[str, Callable[..., State[Any]]] = {
    "crashed": Crashed,
    "cancelling": Cancelling,
    "cancelled": Cancelled,
}


def start_node(
    node: NodeConfig,
    config: RegenConfig,
    assignment: NodeAssignment,
    blocks: dict[str, str | None],
    parent: FlowRun,
) -> FlowRun:
    """Create the node's child run on its deployment and return at once (`timeout=0`); the
    idempotency key makes a retried parent find the child it already started."""
    child: FlowRun = run_deployment(
        node.deployment_name,
        parameters=child_parameters(node, config, assignment, blocks),
        flow_run_name=f"{parent.name}-{node.name}",
        idempotency_key=f"{parent.id}-{node.name}",
        timeout=0,
    )  # type: ignore[assignment]  # sync: the run, not the coroutine
    return child


def _child(run: FlowRun) -> ChildState | None:
    if (s := run.state) is None:
        return None
    return ChildState(s.name, s.message, s.is_final(), s.is_completed(), s.is_running())


@task(name="watch-nodes", persist_result=False, cache_policy=NONE)
def watch_nodes(
    run: OpenedRun, plan: RunPlan, children: dict[str, str], lease_s: float, poll_s: float = 5.0
) -> NodesReport:
    """Poll until every shard is committed or no node is left working; report each node."""
    progress = create_progress_artifact(
        0.0, **artifact("multinode-progress", run.output, "0 % · waiting for the nodes")
    )

    def polled(tally: NodeTally) -> None:
        share = round(100.0 * tally.rows / max(1, plan.num_rows), 2)
        committed = f"{tally.rows:,} / {plan.num_rows:,} rows committed"
        update_progress_artifact(
            artifact_id=progress,  # type: ignore[arg-type]
            progress=share,
            description=described(f"{pct(share / 100)} · {committed}", run.output),
        )

    ids = {node: UUID(rid) for node, rid in children.items()}
    with get_client(sync_client=True) as client:

        def states() -> dict[str, ChildState | None]:
            return {node: _child(client.read_flow_run(rid)) for node, rid in ids.items()}

        watched = watch(
            run.storage, plan.fingerprint, plan.num_shards, states,
            lease_s=lease_s, poll_s=poll_s, on_poll=polled,
        )  # fmt: skip
        outcomes = []
        for node, rid in ids.items():
            end = node_end(watched, node, lease_s)
            if end.stop is not None:
                stop = _STOPS[end.stop](message=end.problem or end.note)
                client.set_flow_run_state(rid, stop, force=True)
            state = client.read_flow_run(rid).state_name or "unknown"
            outcomes.append(outcome(watched, node, str(rid), state, end))
    report = NodesReport(complete=watched.tally.complete, nodes=outcomes)
    create_markdown_artifact(
        report.to_markdown(),
        **artifact(
            "multinode-nodes",
            run.output,
            f"{'complete' if report.complete else 'INCOMPLETE'} · {report.headline()}",
        ),
    )
    logger = get_run_logger()
    for n in report.nodes:
        (logger.error if n.problem else logger.info)(n.summary())
    return report
