"""How many tokens a trainer learns from, per sample, from regen.lossmask: what the loss-mask
check grades (`regen.audit.checks.loss_mask`), and the model template it and template parity
render with.

Each assistant turn is a sample (`samples(..., turns="each")`): with the server's stored ids
the mask is exact and costs only list lengths; without them the model's own chat template
and tokenizer rebuild it (an older dataset, a server that returns no ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from regen.lossmask import ROW_COLUMNS, ChatTemplate, lacks_ids, load_template, samples
from regen.lossmask.ids import sample_sizes


@dataclass(frozen=True)
class ModelTemplate:
    """The model directory's chat template, or None and why; and run.json's thinking."""

    template: ChatTemplate | None
    missing: str
    enable_thinking: bool


def load_model_template(path: Path | None, enable_thinking: bool) -> ModelTemplate:
    """From the run's tokenizer path or staged model; a broken tokenizer is a UserError."""
    if path is None:
        why = "no tokenizer or chat template given (model.tokenizer_path)"
        return ModelTemplate(None, why, enable_thinking)
    template, why = load_template(path)
    return ModelTemplate(template, why, enable_thinking)


@dataclass(frozen=True)
class LossMask:
    """Loss tokens per sample and where they came from."""

    tokens: pl.DataFrame
    """Columns id (as the per-turn checks name it: `<id>#t<turn>` in a multi-turn row),
    loss_tokens: one row per measured sample."""
    turns: int
    """Answered turns: each should be a sample."""
    from_ids: int
    from_template: int


@dataclass(frozen=True)
class StoredIds:
    """What one streaming pass over the stored ids found (regen.lossmask.sample_sizes)."""

    sizes: pl.DataFrame
    """id, turn, turns (records of the row), loss_tokens (null without ids)."""

    @property
    def multi_turn(self) -> bool:
        return self.sizes.height > 0 and self.sizes.select(pl.col("turns").max() > 1).item()


def stored_ids(rows: pl.LazyFrame) -> StoredIds:
    """Every turn record's loss-mask size from its ids, reading only ids and turns: the
    lists are counted, never built, and the streaming engine keeps memory bounded."""
    sizes = sample_sizes(rows.select("id", "turns")).select("id", "turn", "turns", "loss_tokens")
    return StoredIds(sizes.collect(engine="streaming"))


def measure_loss_mask(
    rows: pl.LazyFrame, stored: StoredIds, model: ModelTemplate, answers: int, batch_rows: int
) -> LossMask:
    """Each of the `answers` answered turns' loss-mask size: from the stored ids, and for
    the rows where some turn lacks them, `samples` with the model's template."""
    sizes = stored.sizes
    from_ids = int(sizes["loss_tokens"].is_not_null().sum())
    measured = sizes.filter(pl.col("loss_tokens").is_not_null())
    if model.template is None or answers <= from_ids:
        return LossMask(_named(measured), answers, from_ids, 0)
    parts: list[pl.DataFrame] = []
    redone: list[pl.Series] = []
    lacking = rows.filter(lacks_ids("each")).select(ROW_COLUMNS)
    for batch in lacking.collect_batches(chunk_size=batch_rows):
        found = samples(batch, "each", model.template, enable_thinking=model.enable_thinking)
        n = batch.select("id", pl.col("turns").list.len().fill_null(0).alias("turns"))
        n = n.unique("id", keep="first")  # a duplicated row must not count its samples twice
        parts.append(found.select("id", "turn", "loss_tokens").join(n.lazy(), on="id").collect())
        redone.append(batch["id"])
    if redone:
        measured = measured.filter(~pl.col("id").is_in(pl.concat(redone).implode()))
    both = pl.concat([measured, *parts], how="diagonal_relaxed")
    return LossMask(_named(both), answers, from_ids, both.height - from_ids)


def _named(sizes: pl.DataFrame) -> pl.DataFrame:
    """Samples named as the per-turn checks name them (regen.audit.dataset.per_turn)."""
    multi = pl.col("turns") > 1
    return sizes.select(
        pl.when(multi).then(pl.format("{}#t{}", "id", "turn")).otherwise("id").alias("id"),
        pl.col("loss_tokens").cast(pl.Int64),
    )
