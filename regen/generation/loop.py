"""Which shard runs when: a `ShardSource`, chosen once as the flow starts, decides which shards
a run generates; here every pending shard at once (`AllPending`, a run of its own).

The other source is a node of a multi-node run claiming shards one by one
(`regen.multinode.loop.ClaimedShards`). Shards run through `submit`, a callable that starts one
and returns a `concurrent.futures.Future` (tasks/generate.py adapts a Prefect task's future to
one; a test uses a thread pool); a source only decides which shard goes next and what a result
means.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Protocol

from regen.dataset.keys import progress_key
from regen.generation.outcome import ShardOutcome
from regen.generation.run_plan import RunPlan
from regen.generation.shard import Fence, Log, stops_run
from regen.storage import Storage

SubmitShard = Callable[[int, Fence | None], "futures.Future[ShardOutcome]"]
"""Start one shard (with the node's lease in a multi-node run); its future gives the outcome."""

Window = int | Callable[[], int]
"""Shards held running at once: a number, or read again as the fleet's slots change (each
server's concurrency is tuned while the run goes)."""

RECHECK_S = 1.0
"""How often a running loop reads a changing window again while no shard ends."""


def window_now(window: Window) -> int:
    return window() if callable(window) else window


def shards_in_flight(slots: int, shard_size: int) -> int:
    """Enough shards running to keep every slot busy past a shard's stragglers, and no more.

    A shard stays open until its longest answer ends, so the slots (servers x concurrency)
    need twice their number of rows queued plus two shards behind; each claimed shard beyond
    that is one fewer for a faster node to take over.
    """
    return max(4, math.ceil(2 * slots / shard_size) + 2)


@dataclass
class NodeResult:
    """What this node committed, and the shards that failed here after their retries."""

    outcomes: list[ShardOutcome] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    fatal: Exception | None = None
    """The first failure no other shard can get past (`stops_run`: a full disk, a fleet gone
    or refusing the key, the output's lease lost to another run): no new shard starts after
    it, and it, not the shards it took down with it, is what the run ends with."""

    def settle(self, shard: int, future: futures.Future[ShardOutcome]) -> ShardOutcome | None:
        """The outcome, or None with the failure recorded: a shard that failed after its
        retries does not stop the others from committing; one that failed for a cause that
        stops the run is that cause, said once, not a failed shard."""
        try:
            return future.result()
        except Exception as err:
            if stops_run(err):
                self.fatal = self.fatal or err
            else:
                self.failures.append(f"shard {shard:06d}: {err}")
            return None

    def headline(self, node: str) -> str:
        done, failed = len(self.outcomes), len(self.failures)
        return f"node {node}: {done} shard(s) committed here, {failed} failed"


def run_all(
    shards: list[int],
    submit: SubmitShard,
    *,
    window: Window,
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
            and len(running) < window_now(window)
            and (shard := next(todo, None)) is not None
        ):
            running[submit(shard, None)] = shard
        if not running:
            result.outcomes.sort(key=lambda o: o.shard)
            return result
        ended = futures.wait(running, timeout=RECHECK_S, return_when=futures.FIRST_COMPLETED)
        for future in ended.done:
            outcome = result.settle(running.pop(future), future)
            if outcome is not None and outcome.committed:
                result.outcomes.append(outcome)
                if on_outcome is not None:
                    on_outcome(outcome)


class ShardSource(Protocol):
    """Which shards a run generates, and what follows from that: a run of its own
    (`AllPending`) or a node of a multi-node run (`regen.multinode.loop.ClaimedShards`)."""

    @property
    def node(self) -> str | None:
        """The node whose share of a multi-node run this is (it names the run); None alone."""

    @property
    def lease_run(self) -> str | None:
        """The run whose lease on the output this run joins (a node's parent); None to take
        its own."""

    @property
    def progress_key(self) -> str:
        """Where this run writes its progress: each node of a multi-node run has its own."""

    @property
    def whole_run(self) -> bool:
        """Whether this run is the whole run: it sends the canary and audits the dataset. The
        nodes of a multi-node run rely on the rolling audit, and the parent, which sees every
        shard, audits."""

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
        """Generate this run's shards through `submit`, up to `window` at once; once `stop()`
        is true no new shard starts and the running ones end (what they generated is
        committed). `on_outcome` sees each shard committed here."""


class AllPending:
    """A run of its own: every pending shard of its plan, in plan order."""

    @property
    def node(self) -> None:
        return None

    @property
    def lease_run(self) -> None:
        return None

    @property
    def progress_key(self) -> str:
        return progress_key()

    @property
    def whole_run(self) -> bool:
        return True

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
        return run_all(plan.pending, submit, window=window, on_outcome=on_outcome, stop=stop)
