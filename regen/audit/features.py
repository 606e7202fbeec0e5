"""One small row of facts per sample, computed in bounded batches so text never piles up.

Every check reads this frame instead of the texts: a million rows of flags and lengths
fit in a few tens of MB, while the texts they came from do not need to be held at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.config import AuditConfig
from regen.schema import SAMPLING

TEXT_COLUMNS = ["reasoning_content", "content"]
"""Text kept in the facts frame for one batch only (`FlagCheck.batch_facts`)."""
UNRECORDED = "unrecorded"
"""The setting of rows written before rows recorded theirs."""


def blank(col: str) -> pl.Expr:
    """Null, empty or only whitespace."""
    return pl.col(col).is_null() | (pl.col(col).str.strip_chars() == "")


def normalised_answer() -> pl.Expr:
    """Lowercase, strip, whitespace collapsed: the key of the answer-collapse check."""
    return (
        pl.col("content").fill_null("").str.to_lowercase().str.replace_all(r"\s+", " ")
    ).str.strip_chars()


def setting_label() -> pl.Expr:
    """The row's sampling setting and thinking mode as one key, e.g. `temperature=0.6
    top_p=0.95 top_k=20 min_p=0.0 thinking=on`: what the audit's figures are grouped by."""
    s = pl.col("sampling").struct
    thinking = pl.when(s.field("enable_thinking")).then(pl.lit("on")).otherwise(pl.lit("off"))
    label = pl.format(
        "temperature={} top_p={} top_k={} min_p={} thinking={}",
        s.field("temperature"), s.field("top_p"), s.field("top_k"), s.field("min_p"), thinking,
    )  # fmt: skip
    return pl.when(pl.col("sampling").is_null()).then(pl.lit(UNRECORDED)).otherwise(label)


def thinks() -> pl.Expr:
    """Whether the row's requests asked for thinking: its recorded enable_thinking; a row
    without a record follows the run's `regeneration.thinking` (the checks that read this are
    skipped when that is off)."""
    return pl.col("sampling").struct.field("enable_thinking").fill_null(True)


def answer_tokens() -> pl.Expr:
    """The row's own token counts where they say it, else a whitespace word count."""
    words = pl.col("content").fill_null("").str.count_matches(r"\S+").cast(pl.Int64)
    completion = pl.col("completion_tokens")
    return (
        pl.when(completion.is_not_null() & pl.col("reasoning_tokens").is_not_null())
        .then(completion - pl.col("reasoning_tokens"))
        .when(completion.is_not_null() & blank("reasoning_content"))
        .then(completion)
        .otherwise(words)
        .clip(lower_bound=0)
    )


def answered() -> pl.Expr:
    """The row is a completion, not an error row: every answer check leaves error rows out."""
    return pl.col("error").is_null()


def row_facts(checks: Sequence[FlagCheck], config: AuditConfig) -> list[pl.Expr]:
    """Row-wise expressions only, so the streaming engine can run them chunk by chunk: the
    facts every check shares, then each flag check's own (`FlagCheck.facts`)."""
    ok = answered()
    return [
        pl.col("id"),
        pl.col("shard"),
        pl.col("server").fill_null("<unknown>"),
        setting_label().alias("setting"),
        thinks().alias("thinks"),
        (~ok).alias("is_error"),
        pl.col("error").str.slice(0, 400),  # an error example's reason; the head says why
        pl.col("finish_reason").fill_null("<none>"),
        pl.col("prompt_tokens"),
        pl.col("reasoning_tokens"),
        pl.col("completion_tokens"),
        pl.when(ok).then(answer_tokens()).alias("answer_tokens"),
        *(fact for check in checks for fact in check.facts(config)),
        pl.when(ok & ~blank("content")).then(normalised_answer().hash()).alias("answer_key"),
        pl.when(ok).then(pl.col("reasoning_content")).alias("reasoning_content"),
        pl.when(ok).then(pl.col("content")).alias("content"),
    ]


def collect_features(
    rows: pl.LazyFrame, checks: Sequence[FlagCheck], config: AuditConfig
) -> pl.DataFrame:
    """The facts frame: one row per committed row, texts dropped after each batch."""
    if "sampling" not in rows.collect_schema():
        rows = rows.with_columns(pl.lit(None, SAMPLING).alias("sampling"))
    facts = rows.select(row_facts(checks, config))
    batches = [
        batch.drop(TEXT_COLUMNS).with_columns(
            [s for c in checks for s in c.batch_facts(batch, config)]
        )
        for batch in facts.collect_batches(chunk_size=config.batch_rows)
    ]
    if not batches:
        empty = facts.head(0).collect()
        return empty.drop(TEXT_COLUMNS).with_columns(
            [s for c in checks for s in c.batch_facts(empty, config)]
        )
    return pl.concat(batches)
