"""A node of a multi-node run: claim a shard, generate it, commit it, repeat.

A node keeps going until every shard of the run is committed or given up here, so the shards
of a node that died are taken over once their leases run out, and the dataset completes as
long as one node lives. `ClaimedShards` is the node's `regen.generation.loop.ShardSource`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

from regen.dataset.keys import progress_key
from regen.generation.loop import (
    AllPending,
    NodeResult,
    ShardSource,
    SubmitShard,
    Window,
    window_now,
)
from regen.generation.outcome import ShardOutcome
from regen.generation.run_plan import RunPlan
from regen.generation.shard import Log
from regen.multinode.balance import ShardPicker
from regen.multinode.claims import LeaseKeeper, ShardClaims
from regen.multinode.lease import Lease
from regen.multinode.nodes import NodeAssignment
from regen.storage import Storage


def run_claimed(
    storage: Storage,
    node: NodeAssignment,
    fingerprint: str,
    submit: SubmitShard,
    *,
    window: Window,
    info: dict[str, str] | None = None,
    on_outcome: Callable[[ShardOutcome], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> NodeResult:
    """Keep up to `window` claimed shards running until none is left to any node.

    `info` goes into the node's heartbeat (the flow run's id); `on_outcome` sees each shard
    committed here; once `stop()` is true no new shard is claimed and the running ones end.
    """
    claims = ShardClaims(storage, node.name, node.lease_s)
    picker = ShardPicker(claims, node.ranges, node.weights, fingerprint)
    poll_s = min(5.0, node.lease_s / 4)
    result = NodeResult()
    with LeaseKeeper(claims, info) as keeper:
        lease = Lease(claims, keeper)
        running: dict[futures.Future[ShardOutcome], int] = {}
        while True:
            while (
                not stop()
                and result.fatal is None
                and len(running) < window_now(window)
                and (shard := picker.next()) is not None
            ):
                keeper.hold(shard)
                running[submit(shard, lease)] = shard
            if not running:
                if stop() or result.fatal is not None or not picker.outstanding():
                    break
                # Others hold these: wait for their commits, or for their leases to run out.
                time.sleep(poll_s)
                continue
            done = futures.wait(running, timeout=poll_s, return_when=futures.FIRST_COMPLETED).done
            for future in done:
                shard = running.pop(future)
                keeper.drop(shard)
                outcome = result.settle(shard, future)
                if outcome is None:  # failed after its retries here; another node may try
                    picker.finish(shard, failed=True)
                    continue
                picker.finish(shard, failed=False)
                if not outcome.committed:
                    continue
                claims.release(shard)
                result.outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)
    return result


@dataclass(frozen=True)
class ClaimedShards:
    """A node of a multi-node run: the shards it claims, under its lease, until none is left
    to any node; its heartbeat names its flow run."""

    assignment: NodeAssignment
    flow_run_id: str

    @property
    def node(self) -> str:
        return self.assignment.name

    @property
    def lease_run(self) -> str | None:
        return self.assignment.lease_run

    @property
    def progress_key(self) -> str:
        return progress_key(self.assignment.name)

    @property
    def whole_run(self) -> bool:
        return False

    def run(
        self,
        storage: Storage,
        plan: RunPlan,
        submit: SubmitShard,
        *,
        window: Window,
        on_outcome: Callable[[ShardOutcome], None],
        stop: Callable[[], bool],
        log: Log,
    ) -> NodeResult:
        result = run_claimed(
            storage, self.assignment, plan.fingerprint, submit, window=window,
            info={"flow_run_id": self.flow_run_id}, on_outcome=on_outcome, stop=stop,
        )  # fmt: skip
        log.info(result.headline(self.node))
        return result


def shard_source(node: NodeAssignment | None, flow_run_id: str) -> ShardSource:
    """The run's shards, chosen once as its flow starts: every pending one, or with `node`
    (the run is one node of a multi-node run) those the node claims."""
    return AllPending() if node is None else ClaimedShards(node, flow_run_id)
