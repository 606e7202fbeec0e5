"""The shard plan: shard k holds valid rows [k*S, (k+1)*S) in input order, so the same
prompts and shard size always give the same shards, and a resumed run finds its own."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from regen.dataset.keys import PLAN_KEY
from regen.dataset.manifest import Manifest
from regen.errors import UserError
from regen.storage import Storage

if TYPE_CHECKING:  # only read: regen.prompts may use this package's keys
    from regen.prompts import PromptSet

_RANGE = re.compile(r"^(\d*):(\d*)$")


@dataclass(frozen=True)
class ShardPlan:
    """`assignments` has one row per valid input id: id (String), shard (Int64)."""

    num_rows: int
    shard_size: int
    num_shards: int
    assignments: pl.DataFrame


def plan_shards(prompt_set: PromptSet, shard_size: int) -> ShardPlan:
    """Deterministic: the valid rows in input order, cut every `shard_size` rows."""
    if shard_size <= 0:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    assignments = prompt_set.valid.select(
        "id", (pl.int_range(pl.len(), dtype=pl.Int64) // shard_size).alias("shard")
    )
    num_rows = assignments.height
    return ShardPlan(num_rows, shard_size, -(-num_rows // shard_size), assignments)


def read_plan(storage: Storage) -> pl.DataFrame | None:
    """plan.parquet's id and shard columns, or None when the root has none."""
    if not storage.exists(PLAN_KEY):
        return None
    try:
        plan = pl.read_parquet(
            storage.polars_path(PLAN_KEY),
            columns=["id", "shard"],
            storage_options=storage.polars_options(),
        )
    except (pl.exceptions.PolarsError, OSError) as err:
        raise UserError(f"{storage.uri}/{PLAN_KEY}: unreadable: {err}") from None
    return plan.with_columns(pl.col("id").cast(pl.String), pl.col("shard").cast(pl.Int64))


def pending_shards(
    plan: ShardPlan, committed: dict[int, Manifest], selection: range | None = None
) -> list[int]:
    """Shards of the plan (or of `selection`) without a commit, in order."""
    shards = selection if selection is not None else range(plan.num_shards)
    return [k for k in shards if k not in committed]


def parse_shard_range(spec: str | None, num_shards: int) -> range:
    """`100:200`, `100:` or `:200` (half-open, like Python); an end past the plan is clamped."""
    if spec is None or spec == "":
        return range(num_shards)
    match = _RANGE.match(spec.strip())
    if not match:
        raise UserError(f"generation.shards: {spec!r} is not START:END, e.g. 100:200")
    start = int(match.group(1) or 0)
    end = min(int(match.group(2)) if match.group(2) else num_shards, num_shards)
    if start >= num_shards:
        raise UserError(
            f"generation.shards: {spec!r} is past the plan's {num_shards} shards (0:{num_shards})"
        )
    if start >= end:
        raise UserError(f"generation.shards: {spec!r} selects no shard (start must be < end)")
    return range(start, end)
