"""Which shard runs when: every pending shard at once (one node), or claim a shard, generate
it, commit it, repeat (one node of several).

A node of several keeps going until every shard of the run is committed or given up here, so the
shards of a node that died are taken over once their leases run out, and the dataset
completes as long as one node lives. Shards run through `submit`, a callable that starts one
and returns a `concurrent.futures.Future` (tasks/generate.py adapts a Prefect task's future to
one; a test uses a thread pool); the loop only decides which shard goes next and what a result
means.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

from regen.balance import ShardPicker
from regen.claims import LeaseKeeper, ShardClaims
from regen.diskfull import DiskFull
from regen.generation.lease import Lease
from regen.generation.outcome import ShardOutcome
from regen.nodes import NodeAssignment
from regen.storage import Storage

SubmitShard = Callable[[int, Lease | None], "futures.Future[ShardOutcome]"]
"""Start one shard (with the node's lease in a multi-node run); its future gives the outcome."""


@dataclass
class NodeResult:
    """What this node committed, and the shards that failed here after their retries."""

    outcomes: list[ShardOutcome] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    fatal: DiskFull | None = None
    """A failure no other shard can get past (a full disk): no new shard starts after it."""

    def settle(self, shard: int, future: futures.Future[ShardOutcome]) -> ShardOutcome | None:
        """The outcome, or None with the failure recorded: a shard that failed after its
        retries does not stop the others from committing."""
        try:
            return future.result()
        except DiskFull as err:
            self.fatal = self.fatal or err
            return None
        except Exception as err:
            self.failures.append(f"shard {shard:06d}: {err}")
            return None

    def headline(self, node: str) -> str:
        done, failed = len(self.outcomes), len(self.failures)
        return f"node {node}: {done} shard(s) committed here, {failed} failed"


def run_all(
    shards: list[int],
    submit: SubmitShard,
    *,
    window: int,
    on_outcome: Callable[[ShardOutcome], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> NodeResult:
    """Every shard, up to `window` running at once, in plan order; once `stop()` is true no
    new shard starts and the running ones end (what they generated is committed)."""
    result = NodeResult()
    todo = iter(shards)
    running: dict[futures.Future[ShardOutcome], int] = {}
    while True:
        while (
            not stop()
            and result.fatal is None
            and len(running) < window
            and (shard := next(todo, None)) is not None
        ):
            running[submit(shard, None)] = shard
        if not running:
            result.outcomes.sort(key=lambda o: o.shard)
            return result
        for future in futures.wait(running, return_when=futures.FIRST_COMPLETED).done:
            outcome = result.settle(running.pop(future), future)
            if outcome is not None and outcome.committed:
                result.outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)


def run_claimed(
    storage: Storage,
    node: NodeAssignment,
    fingerprint: str,
    submit: SubmitShard,
    *,
    window: int,
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
                and len(running) < window
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
