"""`rejects/rejects.parquet`: the input rows the plan left out, kept with the dataset they were
left out of (the audit's rejects check reads them). Written here, by the layout's owner, so
regen.prompts, which finds the rejects, needs nothing of this package.
"""

from __future__ import annotations

import io

import polars as pl

from regen.dataset._encode import parquet_bytes
from regen.dataset.keys import REJECTS_KEY
from regen.prompts import REJECTS_SCHEMA
from regen.storage import Storage


def write_rejects(storage: Storage, rejects: pl.DataFrame) -> None:
    """Always written, even empty, so the audit can tell "no rejects" from "not recorded"."""
    storage.write_bytes(REJECTS_KEY, parquet_bytes(rejects))


def read_rejects(storage: Storage) -> pl.DataFrame | None:
    """The rejects the last plan wrote (`REJECTS_SCHEMA`), or None on a root that has none
    recorded (made before rejects were written)."""
    try:
        data = storage.read_bytes(REJECTS_KEY)
    except FileNotFoundError:
        return None
    return pl.read_parquet(io.BytesIO(data)).cast(REJECTS_SCHEMA)
