"""The parts of a dataset root the audit reads: committed shards, the plan and run.json.

Only shards with a manifest are read: a data file without one is an interrupted write
that the next run regenerates, so it is not part of the dataset yet.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import polars as pl

from regen.errors import UserError
from regen.schema import row_schema
from regen.storage import Storage

_SHARD_KEY = re.compile(r"^shards/shard-(\d{6,})\.(parquet|json)$")


@dataclass(frozen=True)
class DatasetView:
    """Where the committed rows are and what was planned."""

    committed: dict[int, str]
    """Shard number -> parquet key, for every shard that has both data and manifest."""
    manifest_without_data: list[int]
    plan: pl.DataFrame | None
    """Columns id, shard: every valid input id; None when the root has no plan.parquet."""


def open_dataset(storage: Storage) -> DatasetView:
    """List shards and read the plan; a root with neither is not a dataset."""
    data: set[int] = set()
    manifests: set[int] = set()
    for key in storage.list("shards/"):
        match = _SHARD_KEY.match(key)
        if match:
            (data if match.group(2) == "parquet" else manifests).add(int(match.group(1)))
    plan = _read_plan(storage)
    if not data and not manifests and plan is None:
        raise UserError(f"{storage.uri}: no shards/ and no plan.parquet: not a regen dataset")
    committed = {n: f"shards/shard-{n:06d}.parquet" for n in sorted(data & manifests)}
    return DatasetView(committed, sorted(manifests - data), plan)


def scan_rows(storage: Storage, view: DatasetView) -> pl.LazyFrame:
    """All committed rows, lazily, in shard order; an empty frame when nothing is committed."""
    if not view.committed:
        return pl.LazyFrame(schema=row_schema())
    paths = [storage.polars_path(key) for key in view.committed.values()]
    return pl.scan_parquet(
        paths,
        schema=row_schema(),
        storage_options=storage.polars_options(),
        missing_columns="insert",
        extra_columns="ignore",
    )


def thinking_requested(storage: Storage) -> bool:
    """`sampling.enable_thinking` of run.json; thinking is the default when it is not said."""
    if not storage.exists("run.json"):
        return True
    try:
        run = json.loads(storage.read_bytes("run.json"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{storage.uri}/run.json: not valid JSON: {err}") from None
    sampling = run.get("sampling") if isinstance(run, dict) else None
    value = sampling.get("enable_thinking") if isinstance(sampling, dict) else None
    return value if isinstance(value, bool) else True


def _read_plan(storage: Storage) -> pl.DataFrame | None:
    if not storage.exists("plan.parquet"):
        return None
    try:
        plan = pl.read_parquet(
            storage.polars_path("plan.parquet"),
            columns=["id", "shard"],
            storage_options=storage.polars_options(),
        )
    except (pl.exceptions.PolarsError, OSError) as err:
        raise UserError(f"{storage.uri}/plan.parquet: unreadable: {err}") from None
    return plan.with_columns(pl.col("id").cast(pl.String), pl.col("shard").cast(pl.Int64))


def answer_snippets(rows: pl.LazyFrame, ids: list[str], chars: int = 60) -> dict[str, str]:
    """The first `chars` characters of the answers of a few rows, on one line each."""
    if not ids:
        return {}
    found = rows.filter(pl.col("id").is_in(ids)).select("id", "content").collect()
    return {i: _cut(c or "", chars) for i, c in found.iter_rows()}


def _cut(text: str, chars: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"
