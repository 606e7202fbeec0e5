"""Generate-and-commit of one shard: the unit a task retries.

Rows go through the one shared `Dispatcher` (its own loop in its own thread), so a caller in
any thread only blocks on a future. The manifest is written last: a shard without one was
never committed, whatever else its run left behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Protocol

import polars as pl

from regen.canary import CanaryStopped
from regen.dataset import (
    Manifest,
    ShardCommitted,
    commit_shard,
    prompts_for_shard,
    read_manifest,
    replace_shard,
)
from regen.errors import FleetError, FleetUnauthorized
from regen.generation.outcome import ShardOutcome
from regen.generation.run_plan import RunPlan, rows_to_redo
from regen.storage import Storage
from regen.storage.diskfull import DiskFull, disk_full, is_disk_full
from regen.storage.output_lease import LeaseLost, check_held

_log = logging.getLogger(__name__)

Log = logging.Logger | logging.LoggerAdapter[logging.Logger]


class RowSource(Protocol):
    """Where rows are answered: the run's `Dispatcher` (any thread may submit to it)."""

    def submit_shard(self, shard: int, rows: pl.DataFrame) -> futures.Future[pl.DataFrame]: ...


class Fence(Protocol):
    """A node's hold on a shard it claimed (`regen.multinode.lease.Lease`): its rows are
    committed only while the node holds it, and the manifest names the node."""

    @property
    def node(self) -> str: ...

    def held(self, shard: int) -> bool: ...


@dataclass(frozen=True)
class Commit:
    """A shard just committed, with the rows this run generated for it still in hand (all of
    them, or only the retried error rows): what a per-shard check needs without a re-read."""

    shard: int
    manifest: Manifest
    rows: pl.DataFrame


RETRY_DELAY_S = 5.0
"""Between a failed shard's tries (`generation.shard_retries` of them): long enough for a
storage hiccup to pass, short beside a shard's minutes of generation."""


def stops_run(err: BaseException) -> bool:
    """Whether `err` ends the run's generation, not only its shard: a dead, unauthorised or
    closed fleet (`FleetError`: `FleetGone`, `FleetUnauthorized`), a full disk or the output's
    lease lost to another run fails every other shard alike. The one judge: no new shard
    starts after one, the shards in flight end not committed, and the run ends in one line
    (`regen.generation.stopped`)."""
    return isinstance(err, (FleetError, DiskFull, LeaseLost)) or is_disk_full(err)


def stop_reason(err: BaseException) -> str:
    """A few words for what `stops_run`: each shard in flight says them, the run says the
    cause whole, once."""
    if isinstance(err, FleetUnauthorized):
        return "the servers refused the API key"
    if isinstance(err, FleetError):
        return "the fleet stopped serving"
    if isinstance(err, LeaseLost):
        return "the output's lease went to another run"
    return "the output's disk is full"


def worth_retrying(err: BaseException) -> bool:
    """Whether a shard that failed with `err` is tried again: not after what stops the run
    (`stops_run`); a storage hiccup may pass; a shard another run committed stays committed."""
    return not stops_run(err) and not isinstance(err, ShardCommitted)


def _bytes_per_row(storage: Storage, shard: int) -> float | None:
    """Bytes a committed row takes, from the last committed manifest before `shard`."""
    for other in range(shard - 1, max(shard - 50, -1), -1):
        manifest = read_manifest(storage, other)
        if manifest is not None and manifest.rows:
            return manifest.size / manifest.rows
    return None


OnCommit = Callable[[Commit], None]
"""Called in the shard's thread right after its manifest is written; raising fails the shard's
task (its rows stay committed), so a hook that must stop a run records that and returns."""


def generate_rows(dispatcher: RowSource, shard: int, prompts: pl.DataFrame) -> pl.DataFrame:
    """Any subset of a shard's prompts (`id`, `messages`), answered in input order: a whole
    shard, its error rows, or a sample sent before the rest."""
    return dispatcher.submit_shard(shard, prompts).result()


def generate_shard(
    shard: int,
    plan: RunPlan,
    dispatcher: RowSource,
    storage: Storage,
    *,
    retry_errors: bool = False,
    lease: Fence | None = None,
    on_commit: OnCommit | None = None,
    log: Log = _log,
) -> ShardOutcome:
    """Generate one shard and commit it; a shard this run committed before has only its rows
    edited since (and with `retry_errors` its error rows) generated again and replaced in
    place. With a `lease`, the rows are committed only while the lease holds (otherwise
    another node owns the shard)."""
    start = time.monotonic()
    try:
        return _generate_shard(
            shard, plan, dispatcher, storage, start, retry_errors=retry_errors, lease=lease,
            on_commit=on_commit, log=log,
        )  # fmt: skip
    except CanaryStopped as stop:
        log.warning("shard %06d: not committed: %s", shard, stop)
        return ShardOutcome.lost(shard, time.monotonic() - start, f"not committed: {stop}")
    except OSError as err:
        if not is_disk_full(err):
            raise
        # Not retried: the shard's rows would be generated again only to fail the same write.
        remaining = len(plan.pending) * max(plan.shard_size, 1)
        per_row = _bytes_per_row(storage, shard)
        raise disk_full(err, storage.uri, int(remaining * per_row) if per_row else None) from None
    except ShardCommitted as done:
        # Another run got there first (one that held the output before this one took its
        # lease over): its rows stand, and this run did not fail.
        log.warning("shard %06d: %s; this run's rows for it are not committed", shard, done)
        return ShardOutcome.lost(
            shard, time.monotonic() - start, f"not committed by this run: {done}"
        )


def _fence(storage: Storage, plan: RunPlan, shard: int) -> None:
    """Commit only while the run that made the plan holds the output's lease: a run whose
    lease another took over raises `LeaseLost` here, before it writes a byte of the shard."""
    if plan.lease_run is not None:
        check_held(storage, plan.lease_run, f"shard {shard:06d} not committed")


def _generate_shard(
    shard: int,
    plan: RunPlan,
    dispatcher: RowSource,
    storage: Storage,
    start: float,
    *,
    retry_errors: bool,
    lease: Fence | None,
    on_commit: OnCommit | None,
    log: Log,
) -> ShardOutcome:
    prompts = prompts_for_shard(plan.prompt_cache, shard)
    # This shard's manifest only: listing every manifest per shard grows with the run squared.
    committed = read_manifest(storage, shard)
    redo = rows_to_redo(storage, committed, prompts, plan, retry_errors=retry_errors)
    if redo is not None:
        out = generate_rows(dispatcher, shard, redo)
        timings = {"generate_s": round(time.monotonic() - start, 3)}
        _fence(storage, plan, shard)
        manifest = replace_shard(
            storage, shard, out, fingerprint=plan.fingerprint, timings=timings,
            revision=plan.revision,
        )  # fmt: skip
    else:
        out = generate_rows(dispatcher, shard, prompts)
        timings = {"generate_s": round(time.monotonic() - start, 3)}
        if lease is not None and not lease.held(shard):
            lost = "not committed here: its lease was lost to another node"
            log.warning("shard %06d: %s", shard, lost)
            return ShardOutcome.lost(shard, time.monotonic() - start, lost)
        _fence(storage, plan, shard)
        manifest = commit_shard(
            storage,
            shard,
            out,
            fingerprint=plan.fingerprint,
            timings=timings,
            node=lease.node if lease else None,
            revision=plan.revision,
        )
    log.info(
        "shard %06d committed: %d rows, %d ok, %d failed",
        shard,
        manifest.rows,
        manifest.ok,
        manifest.failed,
    )
    if on_commit is not None:
        on_commit(Commit(shard, manifest, out))
    failed = int(out["error"].is_not_null().sum())
    return ShardOutcome(  # what this run generated: a retried shard's error rows only
        shard=shard,
        rows=out.height,
        ok=out.height - failed,
        failed=failed,
        completion_tokens=int(out["completion_tokens"].sum() or 0),
        seconds=time.monotonic() - start,
    )
