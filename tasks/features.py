"""Stage 7 as Prefect tasks over `regen.features`: the plan, the capture fleet, one task per
feature shard fed through one pool, the progress bar and live card, the summary card."""

from __future__ import annotations

from concurrent import futures
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NONE
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote
from pydantic import BaseModel, SecretStr

from regen.dataset.reader import read_committed
from regen.display.figures import byte_size, duration, sig
from regen.display.naming import artifact, described
from regen.errors import UserError
from regen.features.capture import CaptureError
from regen.features.manifest import FeatureManifest, FeatureRecord, claim_record
from regen.features.pool import CapturePool
from regen.features.shard import capture_shard, shard_samples
from regen.features.site import capture_fleet
from regen.features.stage import (
    FeaturePlan,
    FeatureProgress,
    check_space,
    feature_record,
    plan_features,
    run_shards,
)
from regen.machine.ticker import Ticker
from regen.run import OpenedRun, StagedModel
from regen.storage import Storage, open_storage
from tasks.cards import publish_markdown

SHARDS_IN_FLIGHT = 4
"""Shards captured at once: enough that the pool's window never drains at a shard's end."""


class FeaturesSummary(BaseModel):
    """What the stage did, for the run's summary and the terminal."""

    dest: str
    shards: int
    captured_shards: int
    samples: int
    failed: int
    tokens: int
    bytes: int
    seconds: float


def _worth_retrying(task: object, task_run: object, state: object) -> bool:
    try:
        state.result()  # type: ignore[attr-defined]
    except CaptureError:
        return True
    except Exception:
        return False
    return True


@task(
    name="capture-features",
    task_run_name="capture-features-{shard:06d}",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_worth_retrying,
    persist_result=False,
    cache_policy=NONE,
)
def capture_features_shard(
    shard: int,
    plan: FeaturePlan,
    run: OpenedRun,
    pool: CapturePool,
    storage: Storage,
    progress: FeatureProgress,
) -> FeatureManifest:
    """Capture one dataset shard's samples and commit its feature shard (manifest last)."""
    committed = read_committed(run.storage)
    todo = shard_samples(committed, shard, plan.record)
    manifest = capture_shard(
        todo, pool, storage, plan.record, plan.sources[shard], on_sample=progress.sample
    )
    progress.shard()
    get_run_logger().info(
        "features shard %06d: %d samples, %s tokens, %s in %s%s",
        shard, len(manifest.samples), f"{manifest.tokens:,}", byte_size(manifest.bytes),
        duration(manifest.seconds),
        f", {len(manifest.failed)} refused" if manifest.failed else "",
    )  # fmt: skip
    return manifest


def features_storage(run: OpenedRun) -> Storage:
    dest = run.config.features.dest if run.config.features else None
    return open_storage(dest) if dest else run.storage


def features(run: OpenedRun, model: StagedModel, api_key: SecretStr) -> FeaturesSummary:
    """The whole stage: plan, launch the capture fleet if anything is left, capture, report."""
    logger, config = get_run_logger(), run.config
    assert config.features is not None
    storage = features_storage(run)
    record, layers = feature_record(
        config.features, model.path, config.model.served_name, run.output
    )
    claim_record(storage, record)
    committed = read_committed(run.storage)
    plan = plan_features(committed, storage, record)
    logger.info("%s; %s", plan.headline(), record.describe())
    publish_markdown(
        "features",
        run.output,
        _card(record, plan, storage.uri),
        f"{len(plan.pending):,} / {len(plan.shards):,} feature shards to capture",
    )
    if not plan.pending:
        return _summary(storage, plan, [], 0.0)
    if refused := check_space(storage, plan):
        raise UserError(refused)
    progress = FeatureProgress(plan)
    bar = create_progress_artifact(
        0.0, **artifact("features-progress", run.output, "0 % · launching the capture fleet")
    )
    assert isinstance(bar, UUID)

    def tick() -> None:
        snap = progress.write(storage)
        eta = f"ETA {duration(snap['eta_s'])}" if snap["eta_s"] is not None else "ETA –"
        update_progress_artifact(
            artifact_id=bar,
            progress=round(100 * progress.fraction, 2),
            description=described(
                f"{round(100 * progress.fraction)} % · {sig(snap['tokens_per_s'])} tok/s · "
                f"{byte_size(snap['bytes_written'])} · {eta}",
                run.output,
            ),
        )

    run_id = str(flow_run.id)
    with capture_fleet(config, model.path, api_key, layers, run_id) as (fleet, servers):
        logger.info("capture fleet: %d server(s) ready", len(servers))
        pool = CapturePool(
            servers, fleet.api_key, config.features.concurrency_per_server,
            config.features.max_attempts,
        )  # fmt: skip
        with pool.running(), Ticker("features-progress", 2.0, tick):

            def start(shard: int) -> futures.Future[FeatureManifest]:
                future = capture_features_shard.submit(
                    shard, quote(plan), quote(run), quote(pool), quote(storage), quote(progress),
                    return_state=False,
                )  # fmt: skip
                return _plain(future)

            done, errors = run_shards(plan.pending, start, SHARDS_IN_FLIGHT)
        tick()
    summary = _summary(storage, plan, done, progress.snapshot()["elapsed_s"])
    create_markdown_artifact(
        markdown=_summary_markdown(summary, record),
        **artifact("features-summary", run.output, _summary_line(summary)),
    )
    if errors:
        shard, err = errors[0]
        raise CaptureError(
            f"features: {len(errors)} shard(s) not captured (first: shard {shard:06d}: {err}); "
            f"{len(done)} committed; run again to capture what is left"
        )
    return summary


def _plain(future: object) -> futures.Future[FeatureManifest]:
    out: futures.Future[FeatureManifest] = futures.Future()

    def settle(_: object) -> None:
        try:
            out.set_result(future.result())  # type: ignore[attr-defined]
        except BaseException as err:
            out.set_exception(err)

    future.add_done_callback(settle)  # type: ignore[attr-defined]
    return out


def _summary(
    storage: Storage, plan: FeaturePlan, done: list[FeatureManifest], seconds: float
) -> FeaturesSummary:
    every = {**plan.done, **{m.shard: m for m in done}}
    return FeaturesSummary(
        dest=storage.uri, shards=len(plan.shards), captured_shards=len(done),
        samples=sum(len(m.samples) for m in every.values()),
        failed=sum(len(m.failed) for m in every.values()),
        tokens=sum(m.tokens for m in every.values()),
        bytes=sum(m.bytes for m in every.values()), seconds=seconds,
    )  # fmt: skip


def _summary_line(summary: FeaturesSummary) -> str:
    return (
        f"{summary.samples:,} samples, {byte_size(summary.bytes)} in "
        f"{summary.shards:,} shards ({summary.captured_shards:,} this run)"
    )


def _summary_markdown(summary: FeaturesSummary, record: FeatureRecord) -> str:
    rate = summary.tokens / summary.seconds if summary.seconds else 0.0
    return "\n".join(
        [
            f"**Features** at `{summary.dest}`: {record.describe()}",
            "",
            "| shards | captured this run | samples | refused | tokens | size | tok/s |",
            "|---|---|---|---|---|---|---|",
            f"| {summary.shards:,} | {summary.captured_shards:,} | {summary.samples:,} | "
            f"{summary.failed:,} | {summary.tokens:,} | {byte_size(summary.bytes)} | "
            f"{sig(rate)} |",
        ]
    )


def _card(record: FeatureRecord, plan: FeaturePlan, uri: str) -> str:
    return "\n".join(
        [
            f"**Features** `{uri}/features/`: {record.describe()}",
            "",
            f"- {plan.headline()}",
            "- read with: `regen features-export` into SpecForge's `.ckpt` files or "
            "speculators' `hs_<i>.safetensors` (see the README's features section)",
        ]
    )
