"""The parts of a dataset root the audit reads: committed shards, the plan and run.json.

All of it comes from `regen.dataset`, the layout's one owner: shards through their manifests
(`read_committed`), so data without a manifest, a replaced shard's old generation and another
run's manifest are never read as rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from regen.dataset import (
    read_committed,
    read_plan,
    read_run,
    require_dataset,
    scan_data,
    thinking_mode,
)
from regen.schema import row_schema
from regen.storage import Storage


@dataclass(frozen=True)
class DatasetView:
    """Where the committed rows are and what was planned."""

    committed: dict[int, str]
    """Shard number -> data key, for every shard whose manifest and data both exist."""
    manifest_without_data: list[int]
    unusable_manifests: list[int]
    """Unreadable, naming another shard, or written by a run with another fingerprint."""
    plan: pl.DataFrame | None
    """Columns id, shard: every valid input id; None when the root has no plan.parquet."""
    digests: dict[int, str] = field(default_factory=dict)
    """Shard -> its manifest's sha256 of the data: what a stored audit summary was made from."""
    dropped: frozenset[str] = frozenset()
    """Ids out of the view (gone from the input, `input.removed: drop`): not audited."""


def open_dataset(storage: Storage, *, workers: int = 16) -> DatasetView:
    """Read every manifest (in parallel: on S3 each is a GET) and the plan."""
    found = read_committed(storage, workers=workers)
    require_dataset(storage, found)
    census = found.census
    committed = {shard: m.data for shard, m in found.manifests.items()}
    digests = {shard: m.sha256 for shard, m in found.manifests.items()}
    plan = read_plan(storage)
    if found.dropped and plan is not None:
        hidden = plan.filter(pl.col("id").is_in(list(found.dropped)))
        plan = plan.join(hidden, on="id", how="anti")
        # A summary made before the drop counted those rows: it is made again.
        for shard, count in hidden.group_by("shard").len().iter_rows():
            if shard in digests:
                digests[shard] += f"-{count}dropped"
    return DatasetView(
        committed, census.without_data, census.unusable, plan, digests, found.dropped
    )


def scan_rows(storage: Storage, view: DatasetView) -> pl.LazyFrame:
    """All committed rows of the view, lazily, in shard order; an empty frame when nothing is
    committed."""
    rows = scan_data(storage, list(view.committed.values()))
    return rows.filter(~pl.col("id").is_in(list(view.dropped))) if view.dropped else rows


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
    return thinking_mode(read_run(storage)) == "save"


def thinking_enabled(storage: Storage) -> bool:
    """Whether requests asked for thinking (`enable_thinking`): run.json's
    `regeneration.thinking` is not `off`; templates render another generation prompt."""
    return thinking_mode(read_run(storage)) != "off"


def answer_snippets(rows: pl.LazyFrame, ids: list[str], chars: int = 60) -> dict[str, str]:
    """The first `chars` characters of the answers of a few rows, on one line each."""
    if not ids:
        return {}
    found = rows.filter(pl.col("id").is_in(ids)).select("id", "content").collect()
    return {i: _cut(c or "", chars) for i, c in found.iter_rows()}


def _cut(text: str, chars: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"
