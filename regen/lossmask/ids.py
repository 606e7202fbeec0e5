"""The ids path: trainer samples from the server's own token ids, nothing approximated."""

from __future__ import annotations

import polars as pl

from regen.config.export import Turns

TURN_IDS = pl.Schema(
    {  # type: ignore[arg-type]  # polars' stubs reject a dict literal of mixed dtypes
        "_row": pl.UInt32,
        "id": pl.String,
        "turn": pl.Int64,
        "prompt_token_ids": pl.List(pl.Int32),
        "response_token_ids": pl.List(pl.Int32),
    }
)
"""One turn's tokens, `_row` its row's position in the batch: what both paths produce."""


def _records(rows: pl.LazyFrame, turns: Turns) -> pl.LazyFrame:
    """One row per turn record: `turns` the record, `_row` its row's position, `_n` the
    number of records of its row."""
    exploded = (
        rows.select(
            "id",
            "turns",
            pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"),
            pl.int_ranges(pl.col("turns").list.len()).alias("_i"),
            pl.col("turns").list.len().alias("_n"),
        )
        .explode("turns", "_i")
        .filter(pl.col("turns").is_not_null())
    )
    if turns == "last":
        exploded = exploded.filter(pl.col("_i") == pl.col("_n") - 1)
    return exploded


def turn_ids(rows: pl.LazyFrame, turns: Turns = "each") -> pl.LazyFrame:
    """Each turn record's stored ids (null where the server returned none), in row order."""
    turn = pl.col("turns").struct
    return _records(rows, turns).select(
        "_row",
        "id",
        turn.field("turn").alias("turn"),
        turn.field("prompt_token_ids").alias("prompt_token_ids"),
        turn.field("response_token_ids").alias("response_token_ids"),
    )


def sample_sizes(rows: pl.LazyFrame) -> pl.LazyFrame:
    """`seq_len` and `loss_tokens` of every turn record as `samples_from_ids` gives them
    (null where the turn stores no ids), with `turns`, its row's record count: one
    streaming pass that never builds the lists, for a million-row audit."""
    turn = pl.col("turns").struct
    prompt, response = turn.field("prompt_token_ids"), turn.field("response_token_ids")
    both = prompt.is_not_null() & response.is_not_null()
    return _records(rows, "each").select(
        "id",
        turn.field("turn").alias("turn"),
        pl.col("_n").cast(pl.Int64).alias("turns"),
        pl.when(both).then(_seq_len(prompt, response)).alias("seq_len"),
        pl.when(both).then(_loss_tokens(response)).alias("loss_tokens"),
    )


def _seq_len(prompt: pl.Expr, response: pl.Expr) -> pl.Expr:
    return (prompt.list.len() + response.list.len()).cast(pl.Int64)


def _loss_tokens(response: pl.Expr) -> pl.Expr:
    """Every response token is trained on: the mask's sum is the response's length."""
    return response.list.len().cast(pl.Int64)


def build_samples(turn_frame: pl.LazyFrame) -> pl.LazyFrame:
    """Samples from TURN_IDS rows that have both ids: prompt tokens 0, response tokens 1.

    `seq_len` and `loss_tokens` come from the lengths, so a reader that selects only them
    never builds the lists: polars prunes the unused columns.
    """
    prompt = pl.col("prompt_token_ids")
    response = pl.col("response_token_ids")
    return turn_frame.filter(prompt.is_not_null() & response.is_not_null()).select(
        "id",
        "turn",
        pl.concat_list(prompt, response).alias("input_ids"),
        pl.concat_list(
            # 0 and 1 of each list's length (ids are never null): the fastest way polars has.
            prompt.list.eval(pl.element().is_null().cast(pl.Int8)),
            response.list.eval(pl.element().is_not_null().cast(pl.Int8)),
        ).alias("loss_mask"),
        _seq_len(prompt, response).alias("seq_len"),
        _loss_tokens(response).alias("loss_tokens"),
    )


def samples_from_ids(rows: pl.LazyFrame, turns: Turns = "each") -> pl.LazyFrame:
    """One sample per assistant turn (or per conversation's last turn) that has token ids.

    Columns: `id`, `turn`, `input_ids` (List Int32), `loss_mask` (List Int8), `seq_len`,
    `loss_tokens`. Turns without ids (errors, servers that return none) give no sample.
    """
    return build_samples(turn_ids(rows, turns))
