"""The one loss-mask function: what a trainer learns from, for the audit and every export.

A training sample is one assistant turn: `input_ids` is the prompt as the server's chat
template rendered it followed by the tokens the model generated; `loss_mask` is 0 over the
prompt and 1 over the response. With the server's own ids (`turns[*].prompt_token_ids` and
`response_token_ids`) nothing is approximated.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

Turns = Literal["last", "each"]
"""Which assistant turns of a conversation become samples: the final one, or every one."""


def samples_from_ids(rows: pl.LazyFrame, turns: Turns = "each") -> pl.LazyFrame:
    """One sample per assistant turn (or per conversation's last turn) that has token ids.

    Columns: `id`, `turn`, `input_ids` (List Int32), `loss_mask` (List Int8), `seq_len`,
    `loss_tokens`. Turns without ids (errors, servers that return none) give no sample.
    """
    exploded = (
        rows.select(
            "id",
            "turns",
            pl.int_ranges(pl.col("turns").list.len()).alias("_i"),
            pl.col("turns").list.len().alias("_n"),
        )
        .explode("turns", "_i")
    )
    if turns == "last":
        exploded = exploded.filter(pl.col("_i") == pl.col("_n") - 1)
    prompt = pl.col("turns").struct.field("prompt_token_ids")
    response = pl.col("turns").struct.field("response_token_ids")
    return (
        exploded.filter(prompt.is_not_null() & response.is_not_null())
        .select(
            "id",
            pl.col("turns").struct.field("turn").alias("turn"),
            pl.concat_list(prompt, response).alias("input_ids"),
            pl.concat_list(
                prompt.list.eval(pl.element().is_null().cast(pl.Int8)),
                response.list.eval(pl.element().is_not_null().cast(pl.Int8)),
            ).alias("loss_mask"),
        )
        .with_columns(
            pl.col("input_ids").list.len().cast(pl.Int64).alias("seq_len"),
            pl.col("loss_mask").list.sum().cast(pl.Int64).alias("loss_tokens"),
        )
    )
