"""The parent's side of a multi-node run: start one child run per node, watch them, report.

Children are flow runs of each node's deployment, started with `run_deployment` from the
parent's flow so the UI shows them as its subflows. The parent never waits on one child: it
watches the shared dataset (manifests, heartbeats) and the children's states together, so a
node that vanished with its process is reported instead of waited on forever.
"""

from __future__ import annotations

import time
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
from prefect.states import Cancelled, Cancelling, Crashed
from pydantic import BaseModel

from regen.config import RegenConfig
from regen.naming import artifact_key, dataset_name
from regen.nodes import NodeAssignment, NodeConfig, NodeTally, heartbeat_age
from regen.storage import open_storage
from tasks.generate import RunPlan


class NodeOutcome(BaseModel):
    """One node's part in the run, as the parent saw it end."""

    name: str
    flow_run_id: str
    state: str
    shards: int
    rows: int
    problem: str | None = None
    note: str | None = None


class NodesReport(BaseModel):
    complete: bool
    nodes: list[NodeOutcome]

    @property
    def failed(self) -> list[str]:
        return [n.name for n in self.nodes if n.problem]

    def to_markdown(self) -> str:
        lines = [
            "| node | flow run state | shards | rows | problem |",
            "|---|---|---:|---:|---|",
            *(
                f"| {n.name} | {n.state} | {n.shards} | {n.rows} | {n.problem or n.note or ''} |"
                for n in self.nodes
            ),
        ]
        verdict = "complete" if self.complete else "INCOMPLETE: run again to resume"
        return f"## Nodes\n\ndataset {verdict}\n\n" + "\n".join(lines) + "\n"


def start_node(
    node: NodeConfig,
    config: RegenConfig,
    assignment: NodeAssignment,
    blocks: dict[str, str | None],
    parent: FlowRun,
) -> FlowRun:
    """Create the node's child run on its deployment and return at once (`timeout=0`).

    The idempotency key makes a retried parent find the child it already started instead
    of starting a second one on the same node.
    """
    parameters: dict[str, Any] = {
        "config": node.config_data(config),
        "node": assignment.model_dump(mode="json"),
        "fleet_block": node.fleet_block,
        **blocks,
    }
    return run_deployment(
        node.deployment_name,
        parameters={k: v for k, v in parameters.items() if v is not None},
        flow_run_name=f"{parent.name}-{node.name}",
        idempotency_key=f"{parent.id}-{node.name}",
        timeout=0,
    )


def _problem(run: FlowRun, age: float | None, lease_s: float) -> str | None:
    state = run.state
    if state is None:
        return None
    if state.is_final():
        return None if state.is_completed() else f"{state.name}: {state.message or ''}".strip()
    if age is not None and age > lease_s:
        return f"vanished: no heartbeat for {age:.0f} s"
    return None


@task(name="watch-nodes", persist_result=False, cache_policy=NONE)
def watch_nodes(
    config: RegenConfig,
    plan: RunPlan,
    children: dict[str, str],
    lease_s: float,
    poll_s: float = 5.0,
) -> NodesReport:
    """Poll until every shard is committed or no node is left working; report each node.

    A child still Running whose heartbeat went stale (its worker or machine died) is marked
    Crashed, and one never started once the others finished the dataset is Cancelled, so
    the UI shows what happened to each node.
    """
    logger = get_run_logger()
    storage = open_storage(config.output)
    tally = NodeTally(storage, plan.fingerprint, plan.num_shards)
    name = dataset_name(config.output)
    artifact = create_progress_artifact(
        progress=0.0,
        key=artifact_key("multinode-progress", config.output),
        description=f"{name}: share of prompts committed",
    )
    done_since: float | None = None
    with get_client(sync_client=True) as client:
        while True:
            tally.refresh()
            update_progress_artifact(
                artifact_id=artifact,
                progress=round(100.0 * tally.rows / max(1, plan.num_rows), 2),
            )
            runs = {name: client.read_flow_run(UUID(rid)) for name, rid in children.items()}
            now = time.time()
            ages = {name: heartbeat_age(storage, name, now) for name in children}
            working = [
                name
                for name, run in runs.items()
                if run.state is not None
                and not run.state.is_final()
                and _problem(run, ages[name], lease_s) is None
            ]
            if tally.complete:
                done_since = done_since or time.monotonic()
                # Nodes that are still winding down get a lease to end on their own.
                if not working or time.monotonic() - done_since > lease_s:
                    break
            elif not working:
                break
            time.sleep(poll_s)

        counts = tally.by_node()
        outcomes = []
        for name, run in runs.items():
            problem, note = _problem(run, ages[name], lease_s), None
            state = run.state
            if state is not None and not state.is_final():
                if problem is not None:
                    client.set_flow_run_state(run.id, Crashed(message=problem), force=True)
                elif tally.complete:
                    # Running but not generating (still staging, say): let its worker stop it.
                    note = "not needed: the other nodes finished the dataset"
                    stop = (
                        Cancelling(message=note) if state.is_running() else Cancelled(message=note)
                    )
                    client.set_flow_run_state(run.id, stop, force=True)
            shards, rows = counts.get(name, (0, 0))
            outcomes.append(
                NodeOutcome(
                    name=name,
                    flow_run_id=str(run.id),
                    state=client.read_flow_run(run.id).state_name or "unknown",
                    shards=shards,
                    rows=rows,
                    problem=problem,
                    note=note,
                )
            )
    report = NodesReport(complete=tally.complete, nodes=outcomes)
    failed = [n.name for n in report.nodes if n.problem]
    create_markdown_artifact(
        key=artifact_key("multinode-nodes", config.output),
        markdown=report.to_markdown(),
        description=f"{name}: {len(report.nodes)} node(s)"
        + (f", failed: {', '.join(failed)}" if failed else ""),
    )
    for node in report.nodes:
        log = logger.error if node.problem else logger.info
        log(
            "node %s: %s, %d shard(s), %d rows %s",
            node.name,
            node.state,
            node.shards,
            node.rows,
            node.problem or node.note or "",
        )
    return report
