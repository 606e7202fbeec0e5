"""The output row contract of DESIGN.md, as one polars schema every writer and reader shares."""

from __future__ import annotations

import polars as pl

MESSAGE = pl.Struct({"role": pl.String, "content": pl.String})


def row_schema() -> pl.Schema:
    """Columns of a shard file; `error` is null for a completion, the reason for an error row."""
    return pl.Schema(
        {
            "id": pl.String,
            "shard": pl.Int64,
            "messages": pl.List(MESSAGE),
            "content": pl.String,
            "reasoning_content": pl.String,
            "finish_reason": pl.String,
            "prompt_tokens": pl.Int64,
            "completion_tokens": pl.Int64,
            "reasoning_tokens": pl.Int64,
            "model": pl.String,
            "server": pl.String,
            "attempts": pl.Int64,
            "latency_s": pl.Float64,
            "error": pl.String,
        }
    )
