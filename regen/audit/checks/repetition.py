"""Repetition loops: a decoding loop, a span repeated over most of the reasoning or the answer."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.features import TEXT_COLUMNS
from regen.config import AuditConfig

# Odd 64-bit multipliers: a rolling combination of word hashes that is order-sensitive.
_NGRAM_MUL = 0x100000001B3
_ROW_MUL = 0x9E3779B97F4A7C15


class Repetition(FlagCheck):
    name = "repetition"
    title = "repetition loops"
    threshold = "repetition"

    def batch_facts(self, batch: pl.DataFrame, config: AuditConfig) -> list[pl.Series]:
        """The larger repeated share of the reasoning's and the answer's n-grams (error rows'
        texts are null in the facts frame: 0)."""
        shares = [
            repeated_share(batch[c], config.repetition_ngram, config.repetition_min_words)
            for c in TEXT_COLUMNS
        ]
        return [pl.select(pl.max_horizontal(shares).alias(self.name)).to_series()]

    def hit(self, config: AuditConfig) -> pl.Expr:
        return pl.col(self.name) >= config.repetition_share

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.format(
            "{}% of {}-grams repeated",
            (100 * pl.col(self.name)).round(0).cast(pl.Int64),
            pl.lit(config.repetition_ngram),
        )

    def describe(self, config: AuditConfig) -> str:
        return (
            f"repeat {config.repetition_ngram}-word spans over at least "
            f"{config.repetition_share:.0%} of the reasoning or the answer"
        )


CHECK = Repetition()


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
