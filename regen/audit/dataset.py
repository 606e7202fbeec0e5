"""The parts of a dataset root the audit reads: committed shards, the plan and run.json.

All of it comes from `regen.dataset`, the layout's one owner: shards through their manifests
(`read_committed`), so data without a manifest, a replaced shard's old generation and another
run's manifest are never read as rows, and the view's dropped ids and each shard's identity
are the ones the export uses too.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from regen.dataset import (
    Committed,
    read_committed,
    read_run,
    require_dataset,
    thinking_mode,
    view_plan,
)
from regen.schema import row_schema
from regen.storage import Storage


@dataclass(frozen=True)
class DatasetView:
    """Where the committed rows are and what was planned: `regen.dataset`'s view (its run's
    shards, less the ids `input.removed: drop` leaves out), as the checks read it."""

    found: Committed
    plan: pl.DataFrame | None
    """Columns id, shard: every valid input id in the view; None when the root has no
    plan.parquet."""

    @property
    def committed(self) -> dict[int, str]:
        """Shard number -> data key, for every shard whose manifest and data both exist."""
        return {shard: m.data for shard, m in self.found.manifests.items()}

    @property
    def manifest_without_data(self) -> list[int]:
        return self.found.census.without_data

    @property
    def unusable_manifests(self) -> list[int]:
        """Unreadable, naming another shard, or written by a run with another fingerprint."""
        return self.found.census.unusable

    @property
    def dropped(self) -> frozenset[str]:
        """Ids out of the view (gone from the input, `input.removed: drop`): not audited."""
        return self.found.dropped

    def source(self, shard: int) -> str:
        """What a shard's stored audit summary must have been made from (`Committed.identity`)."""
        return self.found.identity(shard)

    def scan(self, shards: list[int] | None = None) -> pl.LazyFrame:
        """The committed rows of the view (of `shards`), lazily, in shard order; an empty
        frame when nothing is committed."""
        return self.found.scan(shards)


def open_dataset(storage: Storage, *, workers: int = 16) -> DatasetView:
    """Read every manifest (in parallel: on S3 each is a GET) and the plan."""
    found = read_committed(storage, workers=workers)
    require_dataset(storage, found)
    return DatasetView(found, view_plan(storage, found))


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
