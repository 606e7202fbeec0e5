"""One small row of facts per sample, computed in bounded batches so text never piles up.

Every check reads this frame instead of the texts: a million rows of flags and lengths
fit in a few tens of MB, while the texts they came from do not need to be held at once.
"""

from __future__ import annotations

import polars as pl

from regen.config import AuditConfig
from regen.schema import SAMPLING

_TEXT_COLUMNS = ["reasoning_content", "content"]
UNRECORDED = "unrecorded"
"""The setting of rows written before rows recorded theirs."""
# Odd 64-bit multipliers: a rolling combination of word hashes that is order-sensitive.
_NGRAM_MUL = 0x100000001B3
_ROW_MUL = 0x9E3779B97F4A7C15


def _blank(col: str) -> pl.Expr:
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
        .when(completion.is_not_null() & _blank("reasoning_content"))
        .then(completion)
        .otherwise(words)
        .clip(lower_bound=0)
    )


def _row_facts(config: AuditConfig) -> list[pl.Expr]:
    """Row-wise expressions only, so the streaming engine can run them chunk by chunk."""
    fillers = sorted({" ".join(f.lower().split()) for f in config.filler_answers})
    norm = normalised_answer()
    ok = pl.col("error").is_null()
    blank_answer = _blank("content")
    reasoning = pl.col("reasoning_content").fill_null("")
    content = pl.col("content").fill_null("")
    leak = (
        content.str.contains("<think>", literal=True)
        | content.str.contains("</think>", literal=True)
        | (
            reasoning.str.count_matches("<think>", literal=True)
            != reasoning.str.count_matches("</think>", literal=True)
        )
    )
    truncated = pl.col("finish_reason") == "length"
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
        pl.when(~ok)
        .then(None)
        # A tool call is the turn's answer (regen.tools): its content is empty by design.
        .when(pl.col("finish_reason") == "tool_calls")
        .then(None)
        .when(blank_answer)
        .then(pl.lit("empty"))
        .when(norm.is_in(fillers))
        .then(pl.lit("filler"))
        .when(answer_tokens() < config.min_answer_tokens)
        .then(pl.lit("short"))
        .alias("empty_answer"),
        # A row drawn to thinking off has no reasoning by design.
        (ok & thinks() & _blank("reasoning_content")).alias("empty_thinking"),
        (ok & leak).alias("think_leak"),
        (ok & truncated).alias("truncated"),
        (ok & truncated & blank_answer).alias("truncated_in_thinking"),
        pl.when(ok & ~blank_answer).then(norm.hash()).alias("answer_key"),
        pl.when(ok).then(pl.col("reasoning_content")).alias("reasoning_content"),
        pl.when(ok).then(pl.col("content")).alias("content"),
    ]


def repeated_share(texts: pl.Series, ngram: int, min_words: int) -> pl.Series:
    """Per text, the share of its word n-grams that repeat an earlier one (0 when too short).

    A decoding loop repeats a span until max_tokens, so most of its n-grams are repeats;
    ordinary prose repeats almost none. A repeated line is a run of repeated n-grams, so
    line loops are caught too. Works on one flat column of word hashes, not per row.
    """
    words = (
        pl.DataFrame({"t": texts})
        .with_row_index("row")
        .select("row", w=pl.col("t").fill_null("").str.split(" "))
        .explode("w")
        .select("row", h=pl.col("w").hash())
    )
    key = pl.col("h")
    for k in range(1, ngram):
        key = key * _NGRAM_MUL + pl.col("h").shift(-k)
    grams = (
        words.lazy()
        .select("row", key=key + pl.col("row").cast(pl.UInt64) * _ROW_MUL)
        .filter(pl.col("row").shift(-(ngram - 1)) == pl.col("row"))
        .group_by("row")
        .agg(n=pl.len(), unique=pl.col("key").n_unique())
    )
    share = (
        pl.DataFrame({"row": pl.int_range(len(texts), eager=True, dtype=pl.UInt32)})
        .lazy()
        .join(grams, on="row", how="left", maintain_order="left")
        .select(
            pl.when(pl.col("n") >= max(min_words - ngram + 1, 1))
            .then(1 - pl.col("unique") / pl.col("n"))
            .otherwise(0.0)
            .fill_null(0.0)
        )
        .collect()
        .to_series()
    )
    return share.alias("repetition")


def collect_features(rows: pl.LazyFrame, config: AuditConfig) -> pl.DataFrame:
    """The facts frame: one row per committed row, texts dropped after each batch."""
    if "sampling" not in rows.collect_schema():
        rows = rows.with_columns(pl.lit(None, SAMPLING).alias("sampling"))
    batches = []
    for batch in rows.select(_row_facts(config)).collect_batches(chunk_size=config.batch_rows):
        shares = [
            repeated_share(batch[c], config.repetition_ngram, config.repetition_min_words)
            for c in _TEXT_COLUMNS
        ]
        repetition = pl.max_horizontal(shares).alias("repetition")
        batches.append(batch.drop(_TEXT_COLUMNS).with_columns(repetition))
    if not batches:
        empty = rows.select(_row_facts(config)).head(0).collect().drop(_TEXT_COLUMNS)
        return empty.with_columns(pl.lit(0.0).alias("repetition"))
    return pl.concat(batches)
