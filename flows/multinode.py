"""A run across GPU nodes, top to bottom: plan once, one child run per node, audit once.

The parent provisions nothing: each node's child run (`regenerate_completions` with `node`)
checks, stages and launches its own fleet. Shards are shared through claims on the dataset
root, so the nodes' first ranges only say where each starts; a fast node takes over the slow
one's unstarted shards, and a dead node's after its lease.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.states import Completed, Failed, State
from pydantic import BaseModel

from flows.failures import failed_with, quiet_failures
from flows.labels import label_flow_run
from flows.params import open_run
from regen.audit import AuditResult
from regen.config import RegenConfig
from regen.display.naming import run_name, run_tags
from regen.display.outcome import done_line
from regen.multinode.nodes import (
    NodeAssignment,
    NodeConfig,
    check_nodes,
    node_weights,
    split_ranges,
)
from regen.multinode.watch import NodeOutcome
from tasks.audit import audit
from tasks.generate import plan_run
from tasks.lease import hold_output
from tasks.nodes import start_node, watch_nodes


class MultinodeSummary(BaseModel):
    """The parent's result: the dataset, each node's part, and the audit's verdict."""

    output: str
    rows_ok: int
    rows_failed: int
    nodes: list[NodeOutcome]
    failed_nodes: list[str]
    verdict: str


@flow(name="regenerate-multinode", persist_result=False)
def regenerate_multinode(
    config: RegenConfig,
    nodes: list[NodeConfig],
    lease_s: float = 120.0,
    poll_s: float = 5.0,
    model_block: str | None = None,
    storage_block: str | None = None,
    api_key_secret: str | None = None,
) -> MultinodeSummary | State[None]:
    """Regenerate one dataset with several GPU nodes, each on its own deployment and pool.

    `lease_s` is how long a dead node's shards wait before another node takes them; the
    blocks are passed on by name, so every node loads its secrets itself. A failed gate ends
    the run Failed with the verdict as its message, one line per failing check, and no
    traceback (`flows.failures`); the data is kept.
    """
    quiet_failures()
    logger = get_run_logger()
    # The parent's run (each child opens its own), with the block's token for Hub prompts.
    run = open_run(config, model_block=model_block, storage_block=storage_block)
    shared = run.config
    label_flow_run(run_name(shared, "multinode"), run_tags(shared, *(n.name for n in nodes)))
    node_configs = check_nodes(config, nodes)
    parent = get_run_context().flow_run  # type: ignore[union-attr]
    assert parent is not None, "a flow's context has its run"
    # One run per output: the parent holds the lease for the whole run, its nodes join it.
    with hold_output(run):
        plan = plan_run(run)
        # This machine stages no model: a remote model's tokenizer files are fetched now, so an
        # unreadable source fails before any node starts, and the audit renders templates.
        tokenizer = run.tokenizer()
        weights = node_weights(nodes, node_configs)
        ranges = split_ranges(plan.pending, weights)
        for name, shards in ranges.items():
            logger.info(
                "node %s (weight %g) starts with %d shard(s)", name, weights[name], len(shards)
            )
        if plan.pending and not plan.stopped:
            blocks = {
                "model_block": model_block,
                "storage_block": storage_block,
                "api_key_secret": api_key_secret,
            }
            # Every node reads a Hub prompt set at the commit planned here: `main` may move on
            # while they start, and a node reading another commit would revise the plan under
            # the others.
            hub = config.prompts.startswith("hf://")
            read = config.model_copy(update={"prompts": plan.input_path}) if hub else config
            children = {}
            for node in nodes:
                assignment = NodeAssignment(
                    name=node.name, ranges=ranges, weights=weights, lease_s=lease_s,
                    lease_run=str(parent.id),
                )  # fmt: skip
                children[node.name] = str(start_node(node, read, assignment, blocks, parent).id)
            report = watch_nodes(run, plan, children, lease_s, poll_s)
            if not report.complete:
                # An outcome, not a crash: each node's own line (a fleet gone, a refused key)
                # under the headline, returned Failed without a traceback (`flows.failures`).
                headline = (
                    f"dataset incomplete: node(s) {', '.join(report.failed) or 'none'} failed and "
                    f"no node is left working; run again to resume ({shared.output})"
                )
                why = [f"- {n.name}: {n.problem}" for n in report.nodes if n.problem]
                return Failed(message="\n".join([headline, *why]))
            outcomes, failed = report.nodes, report.failed
        else:
            outcomes, failed = [], []
        judged = audit(run.dataset, shared.audit, tokenizer_path=tokenizer, return_state=True)
        if failed:
            logger.error(
                "dataset complete, but node(s) %s failed: see the multinode-nodes artifact",
                ", ".join(failed),
            )
        if ended := failed_with(judged):
            return ended
        result = judged.result()
        assert isinstance(result, AuditResult), "a passed or warned audit returns its result"
        summary = MultinodeSummary(
            output=shared.output,
            rows_ok=result.rows - result.failed_rows,
            rows_failed=result.failed_rows,
            nodes=outcomes,
            failed_nodes=failed,
            verdict=result.verdict,
        )
        # The run's one line as the Completed message: what a notification sends.
        line = done_line(
            shared.output,
            rows_ok=summary.rows_ok,
            rows_failed=summary.rows_failed,
            verdict=result.verdict,
        )
        return Completed(message=line, data=summary)
