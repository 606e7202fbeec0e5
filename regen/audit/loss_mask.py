"""Check 10: how many tokens a trainer learns from, per sample, from regen.lossmask.

Each assistant turn is a sample (`samples(..., turns="each")`): with the server's stored ids
the mask is exact and costs only list lengths; without them the model's own chat template
and tokenizer rebuild it (an older dataset, a server that returns no ids). The check says
how many samples came from each path, and is skipped, never passed, when neither applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from regen.audit.result import Check, Example, grade
from regen.audit.thresholds import AuditConfig
from regen.lossmask import ROW_COLUMNS, ChatTemplate, load_template, samples


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
    loss_tokens."""
    turns: int
    """Answered turns: each should be a sample."""
    from_ids: int
    from_template: int


def measure_loss_mask(rows: pl.LazyFrame, model: ModelTemplate, batch_rows: int) -> LossMask:
    """Every answered turn's loss-mask size, in bounded batches (texts only where no ids)."""
    parts: list[pl.DataFrame] = []
    turns = from_ids = 0
    records = pl.col("turns").list
    # A row without turn records (an older dataset) answered once unless it is an error.
    answered = (
        pl.when(records.len().fill_null(0) > 0)
        .then(records.len())
        .otherwise(pl.col("error").is_null().cast(pl.UInt32))
    )
    with_ids = records.eval(
        pl.element().struct.field("prompt_token_ids").is_not_null()
        & pl.element().struct.field("response_token_ids").is_not_null()
    ).list.sum()
    for batch in rows.select(ROW_COLUMNS).collect_batches(chunk_size=batch_rows):
        counts = batch.select(answered.sum().alias("n"), with_ids.sum().alias("ids")).row(0)
        turns += int(counts[0] or 0)
        from_ids += int(counts[1] or 0)
        multi = batch.filter(records.len() > 1)["id"]
        found = samples(batch, "each", model.template, enable_thinking=model.enable_thinking)
        parts.append(
            found.select(
                pl.when(pl.col("id").is_in(multi.implode()))
                .then(pl.format("{}#t{}", "id", "turn"))
                .otherwise("id")
                .alias("id"),
                "loss_tokens",
            ).collect()
        )
    empty = pl.DataFrame(schema={"id": pl.String, "loss_tokens": pl.Int64})
    tokens = pl.concat(parts) if parts else empty
    return LossMask(tokens, turns, from_ids, tokens.height - from_ids)


def with_loss_tokens(ok: pl.DataFrame, found: LossMask) -> pl.DataFrame:
    """`ok` with each sample's loss_tokens (null where no sample), for the length tables."""
    first = found.tokens.unique("id", keep="first", maintain_order=True)
    return ok.join(first, on="id", how="left", maintain_order="left")


def loss_mask_check(found: LossMask, config: AuditConfig, missing: str) -> Check:
    """The share of samples whose loss mask is at most `min_loss_tokens` tokens; skipped,
    never passed, when no answer could be measured (`missing` says why)."""
    name, title = "loss_mask", "10 loss-mask tokens"
    tokens = found.tokens
    if tokens.height == 0:
        detail = (
            "no completions"
            if found.turns == 0
            else f"no token ids stored in {found.turns} answers and {missing}: loss mask "
            "not measured"
        )
        return Check(name=name, title=title, status="skipped", figure=None, detail=detail)
    limit = config.min_loss_tokens
    short = tokens.filter(pl.col("loss_tokens") <= limit)
    rate = short.height / tokens.height
    q = tokens.select(pl.col("loss_tokens").quantile(p).alias(str(p)) for p in (0.01, 0.5, 0.99))
    p1, p50, p99 = q.row(0)
    shown = short.head(config.max_examples)
    return Check(
        name=name,
        title=title,
        status=grade(rate, config.loss_mask_short),
        figure=rate,
        warn=config.loss_mask_short.warn,
        fail=config.loss_mask_short.fail,
        examples=[Example(id=i, reason=f"{n} loss tokens") for i, n in shown.iter_rows()],
        detail=f"{short.height} of {tokens.height} samples learn from <= {limit} tokens; "
        f"p1 {p1:g}, p50 {p50:g}, p99 {p99:g}; {_sources(found, missing)}",
    )


def _sources(found: LossMask, missing: str) -> str:
    """Which path measured how many samples, and what was left unmeasured."""
    lacking = found.turns - found.from_ids
    text = f"from stored token ids: {found.from_ids}, from the chat template: {found.from_template}"
    if lacking:
        text += f"; {lacking} answers without token ids"
    unmeasured = found.turns - found.from_ids - found.from_template
    if unmeasured > 0:
        text += f", {unmeasured} not measured ({missing or 'not a stored layout'})"
    return text
