"""Stage 4 as Prefect tasks: plan the shards, then one mapped task per pending shard.

Every shard task hands its rows to the one `Dispatcher` the flow started. Mapped tasks
each run in a worker thread with their own event loop, so the dispatcher owns its loop
in its own thread and shard tasks only block on a thread-safe future: the servers see
one continuous queue across shard borders while each shard stays a retryable task.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import get_client, get_run_logger, task, unmapped
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NONE
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.context import get_run_context
from prefect.futures import PrefectConcurrentFuture
from prefect.states import State
from pydantic import BaseModel, SecretStr

from regen.balance import ShardPicker
from regen.claims import LeaseKeeper, ShardClaims
from regen.client import Dispatcher
from regen.config import RegenConfig
from regen.dataset import (
    Manifest,
    cache_prompts,
    commit_shard,
    committed_shards,
    error_rows,
    new_run_info,
    open_run,
    parse_shard_range,
    pending_shards,
    plan_shards,
    progress_key,
    prompts_for_shard,
    read_manifest,
    replace_shard,
)
from regen.errors import FleetError, UserError
from regen.fleet import Fleet
from regen.fleet.metrics import FleetScraper
from regen.naming import artifact_key, dataset_markdown, dataset_name
from regen.nodes import NodeAssignment
from regen.progress import LiveReport, LiveWatch, ProgressSnapshot, ProgressWriter
from regen.prompts import load_prompts, write_rejects
from regen.storage import open_storage


class RunPlan(BaseModel):
    """What generation must do: the run's fingerprint and the shards not yet committed."""

    fingerprint: str
    num_rows: int
    num_shards: int
    rejected: int
    pending: list[int]
    committed_rows: int
    prompt_cache: Path


class ShardOutcome(BaseModel):
    """`committed` is False when the lease was lost: another node generates the shard."""

    shard: int
    rows: int
    ok: int
    failed: int
    completion_tokens: int
    seconds: float
    committed: bool = True

    @classmethod
    def lost(cls, shard: int, seconds: float) -> ShardOutcome:
        return cls(
            shard=shard,
            rows=0,
            ok=0,
            failed=0,
            completion_tokens=0,
            seconds=seconds,
            committed=False,
        )


class GenerationSummary(BaseModel):
    shards_generated: int
    rows: int
    ok: int
    failed: int
    completion_tokens: int
    seconds: float
    tokens_per_s: float

    @classmethod
    def empty(cls) -> GenerationSummary:
        """A resumed run with every shard committed generated nothing."""
        return cls(
            shards_generated=0,
            rows=0,
            ok=0,
            failed=0,
            completion_tokens=0,
            seconds=0.0,
            tokens_per_s=0.0,
        )


@task(name="plan-shards", persist_result=False)
def plan_run(config: RegenConfig) -> RunPlan:
    """Read and validate every prompt, write run.json + plan, and find what is left to do."""
    logger = get_run_logger()
    storage = open_storage(config.output)
    prompts = load_prompts(config.prompts)
    write_rejects(storage, prompts)
    plan = plan_shards(prompts, config.shard_size)
    info = new_run_info(config, prompts, plan)
    run = open_run(storage, info, plan, new_output=config.generation.new_output)
    cache = config.work_dir / "prompts" / f"{run.fingerprint}.parquet"
    cache_prompts(prompts, plan, cache, turns=config.regeneration.turns)
    committed = committed_shards(storage, run.fingerprint)
    selection = parse_shard_range(config.generation.shards, plan.num_shards)
    pending = pending_shards(plan, committed, selection)
    if config.generation.retry_errors:
        pending = sorted(
            {*pending, *(k for k, m in committed.items() if m.failed and k in selection)}
        )
    logger.info(
        "%d prompts (%d rejected) in %d shards of %d; %d committed, %d to generate",
        plan.num_rows,
        prompts.num_rejected,
        plan.num_shards,
        plan.shard_size,
        len(committed),
        len(pending),
    )
    create_markdown_artifact(
        key=artifact_key("dataset", config.output),
        markdown=dataset_markdown(
            storage.uri,
            f"{plan.num_rows:,} prompts in {plan.num_shards:,} shards, "
            f"{len(pending):,} to generate",
        ),
        description=f"{dataset_name(config.output)}: where the data is",
    )
    return RunPlan(
        fingerprint=run.fingerprint,
        num_rows=plan.num_rows,
        num_shards=plan.num_shards,
        rejected=prompts.num_rejected,
        pending=pending,
        committed_rows=_rows_kept(committed, pending),
        prompt_cache=cache,
    )


def _rows_kept(committed: dict[int, Manifest], pending: list[int]) -> int:
    """Rows this run will not generate: whole shards done, and the ok rows of shards whose
    error rows it retries, so progress ends at the total rather than past it."""
    retried = set(pending)
    return sum(m.ok if k in retried else m.rows for k, m in committed.items())


@dataclass(frozen=True)
class Lease:
    """A node's hold on the shards it generates: the fence checked before each commit."""

    claims: ShardClaims
    keeper: LeaseKeeper

    def held(self, shard: int) -> bool:
        """Whether a third of the lease is left: enough for any commit to finish inside it."""
        return not self.keeper.lost(shard) and self.claims.owns(shard, self.claims.lease_s / 3)


def _worth_retrying(task: object, task_run: object, state: State[Any]) -> bool:
    """A dead, unauthorised or closed fleet fails every retry alike; a storage hiccup may not."""
    try:
        state.result()
    except FleetError:
        return False
    except Exception:
        return True
    return True


@task(
    name="generate-shard",
    task_run_name="generate-shard-{shard:06d}",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_worth_retrying,
    persist_result=False,
    cache_policy=NONE,
)
def generate_shard(
    shard: int,
    plan: RunPlan,
    dispatcher: Dispatcher,
    output: str,
    retry_errors: bool,
    lease: Lease | None = None,
) -> ShardOutcome:
    """Generate one shard through the shared dispatcher and commit it (manifest last)."""
    start = time.monotonic()
    storage = open_storage(output)
    rows = prompts_for_shard(plan.prompt_cache, shard)
    # This shard's manifest only: listing every manifest per shard grows with the run squared.
    committed = read_manifest(storage, shard)
    if committed is not None and committed.fingerprint == plan.fingerprint and retry_errors:
        todo = error_rows(storage, shard).select("id")
        out = dispatcher.submit_shard(
            shard, rows.join(todo, on="id", maintain_order="left")
        ).result()
        timings = {"generate_s": round(time.monotonic() - start, 3)}
        manifest = replace_shard(storage, shard, out, fingerprint=plan.fingerprint, timings=timings)
    else:
        out = dispatcher.submit_shard(shard, rows).result()
        timings = {"generate_s": round(time.monotonic() - start, 3)}
        if lease is not None and not lease.held(shard):
            get_run_logger().warning(
                "shard %06d: lease lost to another node; its rows are not committed here", shard
            )
            return ShardOutcome.lost(shard, time.monotonic() - start)
        manifest = commit_shard(
            storage,
            shard,
            out,
            fingerprint=plan.fingerprint,
            timings=timings,
            node=lease.claims.node if lease else None,
        )
    get_run_logger().info(
        "shard %06d committed: %d rows, %d ok, %d failed",
        shard,
        manifest.rows,
        manifest.ok,
        manifest.failed,
    )
    failed = int(out["error"].is_not_null().sum())
    return ShardOutcome(  # what this run generated: a retried shard's error rows only
        shard=shard,
        rows=out.height,
        ok=out.height - failed,
        failed=failed,
        completion_tokens=int(out["completion_tokens"].sum() or 0),
        seconds=time.monotonic() - start,
    )


@contextmanager
def _feeding(
    config: RegenConfig,
    plan: RunPlan,
    fleet: Fleet,
    api_key: SecretStr,
    node: str | None = None,
) -> Iterator[tuple[Dispatcher, ProgressWriter]]:
    """The one dispatcher every shard task feeds, and the progress it is measured by."""
    storage = open_storage(config.output)
    name = dataset_name(config.output)
    # From sync code these return the id, not the coroutine their dispatch type also admits.
    artifact_id = cast(
        UUID,
        create_progress_artifact(
            progress=0.0,
            key=artifact_key("generation-progress", config.output),
            description=f"{name}: share of prompts done",
        ),
    )
    live_id = cast(
        UUID,
        create_markdown_artifact(
            key=artifact_key("fleet-live", config.output),
            markdown="Waiting for the first scrape of the servers' `/metrics`.",
            description=f"{name}: live fleet figures every {config.generation.live_interval_s:g} s",
        ),
    )
    logger = get_run_logger()

    def publish(snapshot: ProgressSnapshot) -> None:
        update_progress_artifact(
            artifact_id=artifact_id, progress=round(100.0 * snapshot.fraction, 2)
        )

    def publish_live(report: LiveReport) -> None:
        logger.info(report.log_line())
        with get_client(sync_client=True) as client:
            client.update_artifact(
                live_id,
                ArtifactUpdate(
                    data=report.to_markdown(),
                    description=f"{name}: live {report.progress.headline()}",
                ),
            )

    with (
        Dispatcher(
            fleet.endpoints,
            api_key=api_key,
            model=config.model.served_name,
            sampling=config.sampling,
            regeneration=config.regeneration,
            generation=config.generation,
            concurrency_per_server=config.concurrency,
            reprobe=fleet.reprobe,
        ) as dispatcher,
        ProgressWriter(
            storage,
            dispatcher,
            total=plan.num_rows,
            already_done=plan.committed_rows,
            interval_s=config.generation.progress_interval_s,
            on_update=publish,
            key=progress_key(node),
        ) as progress,
        LiveWatch(
            progress,
            FleetScraper(fleet.endpoints),
            interval_s=config.generation.live_interval_s,
            on_update=publish_live,
        ),
    ):
        yield dispatcher, progress
        final = progress.snapshot()
    create_markdown_artifact(
        key=artifact_key("generation-summary", config.output),
        markdown=final.to_markdown(),
        description=f"{name}: {final.headline()}",
    )


def _summary(outcomes: list[ShardOutcome], failures: list[str], start: float) -> GenerationSummary:
    if failures:
        raise UserError(f"{len(failures)} shard(s) failed: " + "; ".join(failures[:5]))
    seconds = time.monotonic() - start
    tokens = sum(o.completion_tokens for o in outcomes)
    return GenerationSummary(
        shards_generated=len(outcomes),
        rows=sum(o.rows for o in outcomes),
        ok=sum(o.ok for o in outcomes),
        failed=sum(o.failed for o in outcomes),
        completion_tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds else 0.0,
    )


def generate(
    config: RegenConfig, plan: RunPlan, fleet: Fleet, api_key: SecretStr
) -> GenerationSummary:
    """Map a task over every pending shard, all fed through one dispatcher; raise if any failed."""
    start = time.monotonic()
    outcomes, failures = [], []
    with _feeding(config, plan, fleet, api_key) as (dispatcher, progress):
        mapped = generate_shard.with_options(retries=config.generation.shard_retries).map(
            plan.pending,
            plan=unmapped(plan),
            dispatcher=unmapped(dispatcher),
            output=unmapped(config.output),
            retry_errors=unmapped(config.generation.retry_errors),
        )
        for shard, future in zip(plan.pending, mapped, strict=True):
            try:
                outcome = future.result()
            except Exception as err:  # each shard failed after its retries; others still commit
                failures.append(f"shard {shard:06d}: {err}")
                continue
            outcomes.append(outcome)
            progress.shard_committed(outcome.rows, outcome.ok, outcome.failed)
    return _summary(outcomes, failures, start)


def shards_in_flight(config: RegenConfig, fleet: Fleet) -> int:
    """Enough claimed shards to keep every slot busy past a shard's stragglers, and no more.

    A shard stays open until its longest answer ends, so the slots need twice their number of
    rows queued plus two shards behind; each claimed shard beyond that is one fewer for a
    faster node to take over.
    """
    slots = len(fleet.endpoints) * config.concurrency
    return max(4, math.ceil(2 * slots / config.shard_size) + 2)


def generate_claimed(
    config: RegenConfig,
    plan: RunPlan,
    fleet: Fleet,
    api_key: SecretStr,
    node: NodeAssignment,
) -> GenerationSummary:
    """One node's share of a multi-node run: claim a shard, generate it, commit it, repeat.

    The node keeps going until every shard of the run is committed or given up, so the shards
    of a node that died are taken over once their leases run out, and the dataset completes
    as long as one node lives.
    """
    logger = get_run_logger()
    start = time.monotonic()
    storage = open_storage(config.output)
    claims = ShardClaims(storage, node.name, node.lease_s)
    picker = ShardPicker(claims, node.ranges, node.weights, plan.fingerprint)
    window = shards_in_flight(config, fleet)
    run_id = str(get_run_context().flow_run.id)  # type: ignore[union-attr]
    outcomes: list[ShardOutcome] = []
    failures: list[str] = []
    task = generate_shard.with_options(retries=config.generation.shard_retries)
    with (
        LeaseKeeper(claims, {"flow_run_id": run_id}) as keeper,
        _feeding(config, plan, fleet, api_key, node.name) as (dispatcher, progress),
    ):
        lease = Lease(claims, keeper)
        running: dict[PrefectConcurrentFuture[ShardOutcome], int] = {}
        while True:
            while len(running) < window and (shard := picker.next()) is not None:
                keeper.hold(shard)
                future = task.submit(shard, plan, dispatcher, config.output, False, lease)
                running[future] = shard
            if not running:
                waiting = picker.outstanding()
                if not waiting:
                    break
                # Others hold these: wait for their commits, or for their leases to run out.
                time.sleep(min(5.0, node.lease_s / 4))
                continue
            by_inner = {f.wrapped_future: f for f in running}
            finished = futures.wait(
                by_inner, timeout=min(5.0, node.lease_s / 4), return_when=futures.FIRST_COMPLETED
            ).done
            for future in (by_inner[f] for f in finished):
                shard = running.pop(future)
                keeper.drop(shard)
                try:
                    outcome = future.result()
                except Exception as err:  # failed after its retries here; another node may try
                    failures.append(f"shard {shard:06d}: {err}")
                    picker.finish(shard, failed=True)
                    continue
                picker.finish(shard, failed=False)
                if not outcome.committed:
                    continue
                claims.release(shard)
                outcomes.append(outcome)
                progress.shard_committed(outcome.rows, outcome.ok, outcome.failed)
    logger.info(
        "node %s: %d shard(s) committed here, %d failed", node.name, len(outcomes), len(failures)
    )
    return _summary(outcomes, failures, start)
