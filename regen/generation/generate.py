"""Stage 4 whole, free of Prefect: the canary, with the shards behind it (those of the run's
`ShardSource`), each commit judged by the live gate, until done or stopped.

How a shard is started is the caller's (`start`: a Prefect task's submit in a flow, a thread
pool in a test); everything decided between the shards is here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

from regen.generation.feed import Feed
from regen.generation.live_gate import LiveGate
from regen.generation.loop import ShardSource, shards_in_flight
from regen.generation.outcome import GenerationSummary, ShardOutcome, summarize
from regen.generation.run_plan import RunPlan
from regen.generation.shard import Fence, Log, OnCommit, RowSource
from regen.run import OpenedRun

_log = logging.getLogger(__name__)

StartShard = Callable[
    [int, Fence | None, RowSource, OnCommit, bool], "futures.Future[ShardOutcome]"
]
"""Start one shard: its number, the node's lease (None on a single node), where its rows come
from, the hook its commit calls and whether its error rows are generated again; the future
gives the outcome."""


def generate_plan(
    run: OpenedRun,
    plan: RunPlan,
    feed: Feed,
    start: StartShard,
    source: ShardSource,
    *,
    tokenizer_path: Path | str | None,
    log: Log = _log,
) -> GenerationSummary:
    """Generate the shards of `source` through `feed`; raise if any shard failed after its
    retries, or the cause that stopped them all (`shard.stops_run`: the flow ends on it in one
    line, `regen.generation.stopped`). A stop of the live gate is the summary's `stopped`
    (`report/stopped.json`)."""
    began, config = time.monotonic(), run.config
    live = LiveGate.open(
        run.storage, plan, feed.dispatcher, config.audit, tokenizer_path,
        on_figures=feed.progress.set_audit, log=log,
    )  # fmt: skip
    # One canary per run: the nodes of a multi-node run rely on the rolling audit.
    if source.whole_run and config.audit.live != "off":
        # Judged while the shards start: their rows keep every slot the canary's tail frees
        # busy until its verdict; a stop throws away what the fleet did meanwhile.
        live.start_canary(config.generation.canary_prompts, slots=feed.slots)
        feed.progress.reused(live.reused)

    def window() -> int:
        return shards_in_flight(feed.slots_now(), config.shard_size)

    def submit(shard: int, lease: Fence | None) -> futures.Future[ShardOutcome]:
        # A node claims only shards without a manifest: it never retries error rows.
        retry_errors = config.generation.retry_errors and lease is None
        return start(shard, lease, live.rows, live.on_commit, retry_errors)

    result = source.run(
        run.storage, plan, submit, window=window, on_outcome=feed.committed, stop=live.stopped,
        log=log,
    )  # fmt: skip
    if result.fatal is not None:
        # A fleet gone or refusing the key, a full disk: its one line, not "N shard(s)
        # failed"; the canary, if it was still out, failed on the same cause.
        raise result.fatal
    live.canary_verdict()  # in by now (every shard waited for it); raises what failed it
    stopped = live.record.gate_line() if live.record else None
    return summarize(result.outcomes, result.failures, began, stopped)
