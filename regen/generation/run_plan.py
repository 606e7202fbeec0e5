"""Planning and resume: read the prompts, fix the run's fingerprint, find what is left to do.

A rerun of the same config finds its committed shards by fingerprint and plans only the rest.
Its prompt set may have changed since (a scheduled rerun over a growing set): the plan is then
revised (`regen.dataset.plan.revise_plan`), so new ids fill new shards, an edited id is owed by
its committed shard (which regenerates that row alone and swaps it in), and an id gone from the
input is reported. `generation.retry_errors` adds back committed shards that hold error rows.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from pydantic import BaseModel

from regen.canary import canary_key, read_canary
from regen.canary.stop import check_not_stopped, judge_input
from regen.config import RegenConfig
from regen.dataset import (
    Manifest,
    ShardPlan,
    cache_prompts,
    committed_shards,
    error_rows,
    new_run_info,
    open_run,
    owed,
    parse_shard_range,
    plan_shards,
    read_plan,
    record_revision,
    revise_plan,
)
from regen.dataset._encode import parquet_bytes
from regen.dataset.rejects import write_rejects
from regen.prompts import load_prompts, read_options
from regen.storage import Storage
from regen.storage.output_lease import read_lease


class RunPlan(BaseModel):
    """What generation must do: the run's fingerprint and the shards not yet committed, or
    committed before the input revision that changed some of their rows."""

    fingerprint: str
    num_rows: int
    num_shards: int
    shard_size: int
    rejected: int
    pending: list[int]
    committed_shards: int
    committed_rows: int
    prompt_cache: Path
    revision: int = 1
    changes: str = ""
    """This revision's difference from the dataset's last input, when there was one."""
    removed: int = 0
    """Ids the dataset holds that the input no longer has."""
    removed_policy: str = "keep"
    """`input.removed`: whether the dataset view keeps their rows."""
    input_path: str = ""
    """The prompts as read: a Hub dataset's spec pinned to the commit this plan was made from."""
    stopped: str | None = None
    """The live gate stopped the run on its input's rejects before anything was sent."""
    lease_run: str | None = None
    """The run holding the output's lease as the plan was made (the flow takes or joins it
    just before): each commit checks it still does (`output_lease.check_held`). None when no
    run held it (a plan made outside a run, in a test or a bench): nothing to fence."""

    def headline(self) -> str:
        revised = f"input revision {self.revision}: {self.changes}; " if self.changes else ""
        gone = f" ({self.removed} ids gone from the input: {self.removed_policy})"
        return (
            f"{revised}{self.num_rows:,} prompts ({self.rejected:,} rejected) in "
            f"{self.num_shards:,} shards of {self.shard_size:,}; {self.committed_shards:,} "
            f"committed, {len(self.pending):,} to generate" + (gone if self.removed else "")
        )


def plan_run(config: RegenConfig, storage: Storage, hf_token: str | None = None) -> RunPlan:
    """Validate every prompt, write rejects, run.json and the plan (revised when the root was
    made from another input), cache the rows to send for the shard tasks, and select the
    shards to generate. `hf_token` reads a Hub dataset (None: huggingface_hub's own)."""
    prompts = load_prompts(config.prompts, options=read_options(config.input, hf_token))
    write_rejects(storage, prompts.rejects)
    fresh = plan_shards(prompts, config.shard_size)
    info = new_run_info(config, prompts, fresh)
    # Before anything is written: an unchanged rerun of a stopped run would stop again.
    check_not_stopped(
        storage, info.fingerprint, new_output=config.generation.new_output,
        live=config.audit.live, canary=config.generation.canary_prompts > 0,
    )  # fmt: skip
    run = open_run(storage, info, fresh, new_output=config.generation.new_output)
    plan, changes = fresh, ""
    committed = committed_shards(storage, run.fingerprint)
    if run is not info:  # resumed: compare this input with what the root planned before
        old = read_plan(storage, full=True)
        assert old is not None  # open_run writes a plan beside every run.json
        # Revisions start at 1; an empty plan's max is None (never `or`: 0 would be falsy).
        planned = old.get_column("revision").max()
        latest = max(len(run.revisions), 1 if planned is None else int(planned))  # type: ignore[arg-type]
        plan = revise_plan(old, prompts, config.shard_size, latest + 1, committed)
        if plan.changes.any():
            changes = plan.changes.line()
            _forget_canary_rows(storage, run.fingerprint, plan)
        run = record_revision(storage, run, info, plan)
    selection = parse_shard_range(config.generation.shards, plan.num_shards)
    retried = (
        {k for k, m in committed.items() if m.failed and k in selection}
        if config.generation.retry_errors
        else set()
    )
    work = _work(plan, committed, retried)
    cache = config.work_dir / "prompts" / f"{run.fingerprint}.parquet"
    cache_prompts(prompts, plan, cache, turns=config.regeneration.turns, work=work)
    sent = set(work.get_column("shard").unique().to_list())
    pending = sorted(k for k in sent | retried if k in selection)
    # Judged before any GPU work: the rejects are known now.
    stop = judge_input(storage, run.fingerprint, prompts.rejects, prompts.num_valid, config.audit)
    lease = read_lease(storage)
    return RunPlan(
        fingerprint=run.fingerprint,
        num_rows=plan.num_rows,
        num_shards=plan.num_shards,
        shard_size=plan.shard_size,
        rejected=prompts.num_rejected,
        pending=pending,
        committed_shards=len(committed),
        committed_rows=plan.num_rows - work.height + sum(committed[k].ok for k in retried),
        prompt_cache=cache,
        revision=plan.revision,
        changes=changes,
        removed=plan.removed_ids.len(),
        removed_policy=run.removed,
        input_path=prompts.path,
        stopped=stop.gate_line() if stop else None,
        lease_run=lease.holder.run_id if lease is not None and lease.holder else None,
    )


def rows_to_redo(
    storage: Storage,
    committed: Manifest | None,
    prompts: pl.DataFrame,
    plan: RunPlan,
    *,
    retry_errors: bool,
) -> pl.DataFrame | None:
    """The prompt rows of a shard this run committed before that it must generate again and
    swap in: rows whose content came in a later input revision and, with `retry_errors`, its
    error rows. None when the shard is not this run's, or owes nothing."""
    if committed is None or committed.fingerprint != plan.fingerprint:
        return None
    redo = owed(committed.revision)
    if retry_errors:
        errors = error_rows(storage, committed.shard).get_column("id")
        redo = redo | pl.col("id").is_in(errors.implode())
    rows = prompts.filter(redo)
    return rows if rows.height or retry_errors else None


def _work(plan: ShardPlan, committed: dict[int, Manifest], retried: set[int]) -> pl.DataFrame:
    """The rows of `plan.with_rows()` this run may send: every row of a shard not committed, the
    owed rows of a committed one, and every row of a shard whose error rows are retried
    (which of them are errors is read when the shard runs)."""
    done = pl.DataFrame(
        {"shard": list(committed), "_done": [m.revision for m in committed.values()]},
        schema={"shard": pl.Int64, "_done": pl.Int64},
    )
    return (
        plan.with_rows()
        .filter(~pl.col("removed"))
        .join(done, on="shard", how="left", maintain_order="left")
        .filter(
            pl.col("_done").is_null()
            | (pl.col("revision") > pl.col("_done"))
            | pl.col("shard").is_in(list(retried))
        )
        .drop("_done")
    )


def _forget_canary_rows(storage: Storage, fingerprint: str, plan: ShardPlan) -> None:
    """Drop stored canary rows of ids this revision changed: the canary store outlives a
    revision (it is keyed by the run), and an old answer must never stand in for an edited
    prompt's new one. Done before the plan records the revision, so a crash between the two
    repeats it."""
    stored = read_canary(storage, fingerprint)
    if not stored.height:
        return
    current = plan.assignments.filter(pl.col("revision") == plan.revision).select("id")
    kept = stored.join(current, on="id", how="anti", maintain_order="left")
    if kept.height != stored.height:
        storage.write_bytes(canary_key(fingerprint), parquet_bytes(kept))
