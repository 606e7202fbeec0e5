"""A finished shard as the dataset's rows: what its job collected per row, in the row schema.

Apart from `ShardJob` because the two change for different reasons: the job follows the
dispatcher (which turn is next, what a completion adds), this follows `regen.schema`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from regen.schema import OUTPUT_MESSAGE, SAMPLING, TOOL_CALL, TURN, row_schema

__all__ = ["ID_COLUMNS", "RESULT_COLUMNS", "conversation_frame", "last_turn_frame"]

RESULT_COLUMNS = (
    "content",
    "reasoning_content",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "model",
    "server",
    "attempts",
    "latency_s",
    "error",
)
# The last turn's server ids (turns=last); with turns=all each turn record holds its own.
ID_COLUMNS = ("prompt_token_ids", "response_token_ids")

Columns = Mapping[str, Sequence[Any]]


def last_turn_frame(
    rows: pl.DataFrame,
    shard: int,
    columns: Columns,
    sampling: Sequence[Mapping[str, Any] | None],
    *,
    turns: Sequence[int],
    efforts: Sequence[str | None],
    seeds: Sequence[int | None],
) -> pl.DataFrame:
    """turns=last: the input messages kept, the one answer in the row's columns and its one
    turn record (none on an error row). `rows` holds id, messages and perhaps tools."""
    schema = row_schema()
    results = _results(columns)
    # strict=False: an element that is no int32 becomes null rather than failing the shard.
    ids = pl.DataFrame(
        {name: columns[name] for name in ID_COLUMNS},
        schema=dict.fromkeys(ID_COLUMNS, pl.List(pl.Int32)),
        strict=False,
    ).with_columns(
        pl.Series("tool_calls", columns["tool_calls"], pl.List(TOOL_CALL), strict=False),
        pl.lit(None, pl.String).alias("tool_stop"),
    )
    message = pl.element().struct
    frame = rows.with_columns(
        pl.lit(shard, pl.Int64).alias("shard"),
        pl.col("messages").list.eval(
            pl.struct(
                message.field("role"),
                message.field("content"),
                pl.lit(None, pl.String).alias("reasoning_content"),
                message.field("tool_calls"),
                message.field("tool_call_id"),
            )
        ),
        *([] if "tools" in rows.columns else [pl.lit(None, pl.String).alias("tools")]),
    )
    turn = pl.struct(
        pl.Series("turn", turns, pl.Int64),
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "reasoning_tokens",
        pl.Series("reasoning_effort", efforts, pl.String),
        "server",
        "attempts",
        "latency_s",
        *ID_COLUMNS,
        "tool_calls",
        "tool_stop",
        pl.Series("seed", seeds, pl.Int64),
    )
    out = pl.concat([frame, results, ids, _sampling(sampling)], how="horizontal")
    return (
        out.with_columns(
            pl.when(pl.col("error").is_null())
            .then(pl.concat_list(turn))
            .otherwise(pl.lit([], pl.List(TURN)))
            .alias("turns")
        )
        .select(schema.names())
        .cast(schema)
    )


def conversation_frame(
    rows: pl.DataFrame,
    shard: int,
    columns: Columns,
    history: Sequence[Sequence[Mapping[str, object]]],
    records: Sequence[Sequence[Mapping[str, Any]]],
    sampling: Sequence[Mapping[str, Any] | None],
) -> pl.DataFrame:
    """turns=all: `messages` is the regenerated conversation (up to the failed turn's user
    message on an error row), `turns` the per-turn records."""
    schema = row_schema()
    size = rows.height
    built = pl.DataFrame(
        {
            "id": rows["id"],
            "shard": [shard] * size,
            "messages": history if size else [],
            "turns": records if size else [],
            "tools": rows["tools"] if "tools" in rows.columns else [None] * size,
        },
        schema={
            "id": pl.String,
            "shard": pl.Int64,
            "messages": pl.List(OUTPUT_MESSAGE),
            "turns": pl.List(TURN),
            "tools": pl.String,
        },
    )
    out = pl.concat([built, _results(columns), _sampling(sampling)], how="horizontal")
    return out.select(schema.names()).cast(schema)


def _results(columns: Columns) -> pl.DataFrame:
    schema = row_schema()
    return pl.DataFrame(
        {name: columns[name] for name in RESULT_COLUMNS},
        schema={name: schema[name] for name in RESULT_COLUMNS},
    )


def _sampling(records: Sequence[Mapping[str, Any] | None]) -> pl.DataFrame:
    return pl.DataFrame({"sampling": list(records)}, schema={"sampling": SAMPLING})
