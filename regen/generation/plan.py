"""Planning and resume: read the prompts, fix the run's fingerprint, find what is left to do.

A rerun of the same config and prompts finds its committed shards by fingerprint and plans
only the rest; `generation.retry_errors` adds back committed shards that hold error rows.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from regen.canary.stop import check_not_stopped
from regen.config import RegenConfig
from regen.dataset import (
    Manifest,
    cache_prompts,
    committed_shards,
    new_run_info,
    open_run,
    parse_shard_range,
    pending_shards,
    plan_shards,
)
from regen.prompts import load_prompts, write_rejects
from regen.storage import Storage


class RunPlan(BaseModel):
    """What generation must do: the run's fingerprint and the shards not yet committed."""

    fingerprint: str
    num_rows: int
    num_shards: int
    shard_size: int
    rejected: int
    pending: list[int]
    committed_shards: int
    committed_rows: int
    prompt_cache: Path

    def headline(self) -> str:
        return (
            f"{self.num_rows} prompts ({self.rejected} rejected) in {self.num_shards} shards of "
            f"{self.shard_size}; {self.committed_shards} committed, {len(self.pending)} to generate"
        )


def plan_run(config: RegenConfig, storage: Storage) -> RunPlan:
    """Validate every prompt, write rejects, run.json and the plan, cache the prompts for the
    shard tasks, and select the shards to generate."""
    prompts = load_prompts(config.prompts)
    write_rejects(storage, prompts)
    plan = plan_shards(prompts, config.shard_size)
    info = new_run_info(config, prompts, plan)
    # Before anything is written: an unchanged rerun of a stopped run would stop again.
    check_not_stopped(storage, info.fingerprint, new_output=config.generation.new_output)
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
    return RunPlan(
        fingerprint=run.fingerprint,
        num_rows=plan.num_rows,
        num_shards=plan.num_shards,
        shard_size=plan.shard_size,
        rejected=prompts.num_rejected,
        pending=pending,
        committed_shards=len(committed),
        committed_rows=_rows_kept(committed, pending),
        prompt_cache=cache,
    )


def _rows_kept(committed: dict[int, Manifest], pending: list[int]) -> int:
    """Rows this run will not generate: whole shards done, and the ok rows of shards whose
    error rows it retries, so progress ends at the total rather than past it."""
    retried = set(pending)
    return sum(m.ok if k in retried else m.rows for k, m in committed.items())
