"""Byte encodings every object of the layout shares: zstd Parquet and UTC stamps."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import polars as pl


def parquet_bytes(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd")
    return buf.getvalue()


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
