"""The parts of a dataset root the audit reads: committed shards, the plan and run.json.

A shard is read only through its manifest (regen.shards' commit mark): data without one is
an interrupted write, a replaced shard has two generations for a moment, and a manifest of
another run's fingerprint belongs to superseded data.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from regen.errors import UserError
from regen.schema import row_schema
from regen.storage import Storage

_MANIFEST = re.compile(r"^shards/shard-(\d{6,})\.json$")


@dataclass(frozen=True)
class DatasetView:
    """Where the committed rows are and what was planned."""

    committed: dict[int, str]
    """Shard number -> data key, for every shard whose manifest and data both exist."""
    manifest_without_data: list[int]
    unusable_manifests: list[int]
    """Unreadable, or written by a run with another fingerprint."""
    plan: pl.DataFrame | None
    """Columns id, shard: every valid input id; None when the root has no plan.parquet."""
    digests: dict[int, str] = field(default_factory=dict)
    """Shard -> its manifest's sha256 of the data: what a stored audit summary was made from."""


def open_dataset(storage: Storage, *, workers: int = 16) -> DatasetView:
    """Read every manifest (in parallel: on S3 each is a GET) and the plan."""
    keys = storage.list("shards/")
    present = set(keys)
    numbered = [(int(m.group(1)), k) for k in keys if (m := _MANIFEST.match(k))]
    run = _read_run(storage)
    fingerprint = run.get("fingerprint")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        manifests = list(pool.map(lambda nk: _read_manifest(storage, nk[1]), numbered))
    committed: dict[int, str] = {}
    digests: dict[int, str] = {}
    without_data: list[int] = []
    unusable: list[int] = []
    for (shard, _), manifest in zip(numbered, manifests, strict=True):
        manifest = manifest or {}
        data = manifest.get("data")
        if not isinstance(data, str) or (
            fingerprint and manifest.get("fingerprint") != fingerprint
        ):
            unusable.append(shard)
        elif data not in present:
            without_data.append(shard)
        else:
            committed[shard] = data
            digests[shard] = str(manifest.get("sha256", data))
    plan = _read_plan(storage)
    if not keys and plan is None:
        raise UserError(f"{storage.uri}: no shards/ and no plan.parquet: not a regen dataset")
    return DatasetView(dict(sorted(committed.items())), without_data, unusable, plan, digests)


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


def per_turn(rows: pl.LazyFrame) -> pl.LazyFrame:
    """One row per generated assistant turn, for the checks on answers.

    A conversation regenerated with `turns: all` holds its earlier answers in `messages` and
    their figures in `turns`; each is a training sample as much as the final one, so each is
    checked. Such a turn's id is `<id>#t<turn>`; a row of one turn stays as it is. The turns of
    an error row that succeeded are checked too; its error is counted on the conversation.
    """
    multi = pl.col("turns").list.len().fill_null(0) > 1
    turn = pl.col("turns").struct
    answer = pl.col("_answer").struct
    assistant = pl.element().struct.field("role") == "assistant"
    exploded = (
        rows.filter(multi)
        .with_columns(_answer=pl.col("messages").list.eval(pl.element().filter(assistant)))
        .explode(["_answer", "turns"])
        .with_columns(
            id=pl.format("{}#t{}", "id", turn.field("turn")),
            content=answer.field("content"),
            reasoning_content=answer.field("reasoning_content"),
            finish_reason=turn.field("finish_reason"),
            prompt_tokens=turn.field("prompt_tokens"),
            completion_tokens=turn.field("completion_tokens"),
            reasoning_tokens=turn.field("reasoning_tokens"),
            server=turn.field("server"),
            attempts=turn.field("attempts"),
            latency_s=turn.field("latency_s"),
            error=pl.lit(None, pl.String),
            turns=pl.concat_list("turns"),
        )
        .select(row_schema().names())
    )
    return pl.concat([rows.filter(~multi), exploded])


def thinking_requested(storage: Storage) -> bool:
    """Whether stored rows should carry reasoning: run.json's `regeneration.thinking` is
    `save` (the default when it is not said); `drop` and `off` store none by design."""
    run = _read_run(storage)
    regeneration = run.get("regeneration")
    if isinstance(regeneration, dict) and isinstance(regeneration.get("thinking"), str):
        return regeneration["thinking"] == "save"
    sampling = run.get("sampling")
    value = sampling.get("enable_thinking") if isinstance(sampling, dict) else None
    return value if isinstance(value, bool) else True


def thinking_enabled(storage: Storage) -> bool:
    """Whether requests asked for thinking (`enable_thinking`): run.json's
    `regeneration.thinking` is not `off`; templates render another generation prompt."""
    run = _read_run(storage)
    regeneration = run.get("regeneration")
    if isinstance(regeneration, dict) and isinstance(regeneration.get("thinking"), str):
        return regeneration["thinking"] != "off"
    sampling = run.get("sampling")
    value = sampling.get("enable_thinking") if isinstance(sampling, dict) else None
    return value if isinstance(value, bool) else True


def _read_run(storage: Storage) -> dict[str, Any]:
    if not storage.exists("run.json"):
        return {}
    try:
        run = json.loads(storage.read_bytes("run.json"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{storage.uri}/run.json: not valid JSON: {err}") from None
    return run if isinstance(run, dict) else {}


def _read_manifest(storage: Storage, key: str) -> dict[str, Any] | None:
    try:
        manifest = json.loads(storage.read_bytes(key))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


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
