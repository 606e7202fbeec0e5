"""Stage 4 as Prefect tasks over `regen.generation`: plan, then one task per shard, every
shard fed through the run's one dispatcher (its own loop in its own thread)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any, Protocol
from uuid import UUID

from prefect import get_client, get_run_logger, task
from prefect.artifacts import create_markdown_artifact as markdown
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NONE
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.states import Cancelled, State
from prefect.utilities.annotations import quote
from pydantic import SecretStr

from regen.display.figures import compact, duration
from regen.display.naming import artifact, dataset_markdown, described
from regen.display.plots import live_plots
from regen.display.progress import progress_card, progress_markdown, rows_line
from regen.fleet import Fleet
from regen.generation import run_plan
from regen.generation import shard as shards
from regen.generation.feed import Feed, feeding
from regen.generation.generate import generate_plan
from regen.generation.loop import ShardSource
from regen.generation.outcome import GenerationSummary, ShardOutcome
from regen.generation.run_plan import RunPlan
from regen.generation.shard import Fence, OnCommit, RowSource
from regen.progress.fleet_live import LiveReport
from regen.progress.snapshot import ProgressSnapshot
from regen.run import OpenedRun
from regen.storage import Storage
from tasks.cards import publish_markdown
from tasks.pictures import embedded


@task(name="plan-shards", persist_result=False, cache_policy=NONE)
def plan_run(run: OpenedRun) -> RunPlan:
    """Read and validate every prompt, write run.json + plan, and find what is left to do."""
    plan = run_plan.plan_run(run.config, run.storage, hf_token=run.hf_token)
    logger = get_run_logger()
    logger.info(plan.headline())
    if plan.stopped:
        logger.error("live gate: %s", plan.stopped)
    # The run's one dataset card: the audit rewrites it with what the run left (tasks.cards).
    todo = plan.num_rows - plan.committed_rows
    figures = f"{plan.num_rows:,} prompts in {plan.num_shards:,} shards, {todo:,} to generate"
    publish_markdown(
        "dataset",
        run.output,
        dataset_markdown(run.storage.uri, figures),
        f"{todo:,} / {plan.num_rows:,} rows to generate",
    )
    return plan


def _worth_retrying(task: object, task_run: object, state: State[Any]) -> bool:
    """Prefect's retry condition: the failed state's error, judged by `regen.generation`."""
    try:
        state.result()
    except Exception as err:
        return shards.worth_retrying(err)
    return True


class TaskFuture(Protocol):
    """A task runner's future (Prefect's): a result, and a callback when it has one."""

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any: ...

    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...


def as_future(task_future: TaskFuture) -> futures.Future[ShardOutcome]:
    """A plain future of a task's outcome, for `futures.wait` (Prefect's own future wraps one
    that may hold the task's final State rather than its result)."""
    out: futures.Future[ShardOutcome] = futures.Future()

    def settle(_: object) -> None:
        try:
            out.set_result(_outcome(task_future))
        except Exception as err:
            out.set_exception(err)

    task_future.add_done_callback(settle)
    return out


def _outcome(task_future: TaskFuture) -> ShardOutcome:
    """The shard's outcome: a shard not committed here ended its task Cancelled with it as
    its data; any other end that is not Completed raises, as the task's future does."""
    kept = task_future.result(raise_on_failure=False)
    if isinstance(kept, ShardOutcome):
        return kept
    return task_future.result()


@task(
    name="generate-shard",
    task_run_name="generate-shard-{shard:06d}",
    retries=2,
    retry_delay_seconds=shards.RETRY_DELAY_S,
    retry_condition_fn=_worth_retrying,
    persist_result=False,
    cache_policy=NONE,
)
def generate_shard(
    shard: int,
    plan: RunPlan,
    dispatcher: RowSource,
    storage: Storage,
    retry_errors: bool,
    lease: Fence | None = None,
    on_commit: OnCommit | None = None,
) -> ShardOutcome | State[ShardOutcome]:
    """Generate one shard through the shared dispatcher and commit it (manifest last).

    A shard this run did not commit (the canary stopped the run while it waited, its lease
    went to another node, another run committed it first) ends Cancelled, not Completed, with
    the reason as its message and its outcome as its data: its box is not green beside a log
    that says it was not committed, and the run still reads the outcome (`as_future`).
    So does a shard in flight when the run stopped (`shards.stops_run`: the fleet is gone,
    refused the key, the disk is full), with the cause as its data, which its future raises:
    the run ends on that cause once, not on one failure per shard.
    """
    try:
        outcome = shards.generate_shard(
            shard, plan, dispatcher, storage, retry_errors=retry_errors, lease=lease,
            on_commit=on_commit, log=get_run_logger(),
        )  # fmt: skip
    except Exception as err:
        if not shards.stops_run(err):
            raise
        stopped = f"not committed: the run stopped ({shards.stop_reason(err)})"
        return Cancelled(message=f"shard {shard:06d} {stopped}", data=err)
    if outcome.committed:
        return outcome
    return Cancelled(message=f"shard {shard:06d} {outcome.reason}", data=outcome)


@contextmanager
def _feeding(
    run: OpenedRun, plan: RunPlan, fleet: Fleet, api_key: SecretStr, progress_key: str
) -> Iterator[Feed]:
    """The run's feed, its progress and live figures shown as artifacts."""
    logger = get_run_logger()
    progress_id = create_progress_artifact(
        0.0, **artifact("generation-progress", run.output, "0 % · waiting for the first answers")
    )
    every_s = f"every {run.config.generation.live_interval_s:g} s"
    live_id = markdown(
        "Waiting for the first scrape of the servers' `/metrics`.",
        **artifact("fleet-live", run.output, f"waiting for the first scrape, {every_s}"),
    )
    history_id = create_table_artifact(
        [], **artifact("throughput", run.output, f"output tok/s over the run, {every_s}")
    )
    # From sync code these are the ids, not the coroutines their dispatch type also admits.
    assert isinstance(progress_id, UUID) and isinstance(live_id, UUID)
    assert isinstance(history_id, UUID)

    def progress(snapshot: ProgressSnapshot) -> None:
        # The bar and its card say the same share: generated, or a stopped run's committed.
        update_progress_artifact(
            artifact_id=progress_id,
            progress=round(100 * snapshot.shown_fraction, 2),
            description=described(f"{progress_card(snapshot)} · {rows_line(snapshot)}", run.output),
        )

    def live(report: LiveReport) -> None:
        logger.info(report.log_line())
        update = ArtifactUpdate(
            # Throughput over the run drawn in: a small PNG redrawn each scrape (regen.display).
            data=report.to_markdown() + "\n" + embedded(live_plots(report)),
            description=described(report.card(), run.output),
        )
        # A table artifact's data is its rows as JSON (what create_table_artifact stores).
        rate = f"{compact(report.progress.tokens_per_s)} tok/s"
        history = ArtifactUpdate(
            data=json.dumps(report.history_table()),
            description=described(
                f"{rate} · over {duration(report.progress.elapsed_s)}, {every_s}", run.output
            ),
        )
        with get_client(sync_client=True) as client:
            client.update_artifact(live_id, update)
            client.update_artifact(history_id, history)

    with feeding(
        run.config, run.storage, plan, fleet, api_key, progress_key=progress_key,
        on_progress=progress, on_live=live,
    ) as feed:  # fmt: skip
        yield feed
    assert feed.final is not None
    markdown(
        progress_markdown(feed.final),
        **artifact("generation-summary", run.output, progress_card(feed.final)),
    )


def generate(
    run: OpenedRun,
    plan: RunPlan,
    fleet: Fleet,
    api_key: SecretStr,
    tokenizer_path: str | None,
    source: ShardSource,
) -> GenerationSummary:
    """The canary, then the shards of `source` (every pending one, or a node's claims), each
    as a task fed through one dispatcher, judged by the live gate."""
    task = generate_shard.with_options(retries=run.config.generation.shard_retries)

    def start(
        shard: int, lease: Fence | None, rows: RowSource, on_commit: OnCommit, retry: bool
    ) -> futures.Future[ShardOutcome]:
        # Quoted: Prefect walks every parameter of every task run looking for futures, and a
        # plan of a million prompts (2,000 pending shards) cost 23 ms a task.
        return as_future(
            task.submit(
                shard, quote(plan), quote(rows), quote(run.storage), retry, quote(lease),
                quote(on_commit), return_state=False,
            )
        )  # fmt: skip

    with _feeding(run, plan, fleet, api_key, source.progress_key) as feed:
        try:
            summary = generate_plan(
                run, plan, feed, start, source, tokenizer_path=tokenizer_path,
                log=get_run_logger(),
            )  # fmt: skip
        except Exception as err:
            if shards.stops_run(err):  # the progress card and `regen status`: over, not ETA –
                feed.progress.end(f"stopped: {shards.stop_reason(err)}")
            raise
        # Said by the last progress and live reports, written as the feed closes.
        feed.progress.end(f"stopped: {summary.stopped}" if summary.stopped else "finished")
    assert feed.final is not None
    # One total throughput: the final snapshot's run average, which every artifact quotes.
    return summary.model_copy(update={"tokens_per_s": feed.final.tokens_per_s})
