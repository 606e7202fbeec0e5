"""The prompt cache of a run's shard tasks: each task reads only its own shard's prompts.

Written once per run beside the work dir (not in the dataset root), one row group per shard,
so a filtered scan skips every other shard's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from regen.conversations import Turns, conversation_for
from regen.dataset.plan import ShardPlan

if TYPE_CHECKING:  # only read: regen.prompts may use this package's keys
    from regen.prompts import PromptSet

_SHARDS_PER_WRITE = 64
"""Shards gathered and written at once: big enough that writing is not per-row overhead,
small enough that the rows in hand stay a few MB."""


def cache_prompts(
    prompt_set: PromptSet,
    plan: ShardPlan,
    path: Path,
    turns: Turns = "last",
    *,
    work: pl.DataFrame | None = None,
) -> Path:
    """Write id, shard, messages, tools, revision once, in shard order, one row group per shard.
    `messages` is already what generation sends (`regen.conversations`); `revision` is the
    input revision of the row's content. `work` (rows of `plan.with_rows()`) limits the cache
    to those rows: what the run may send, so a sample of the cache (the canary) never picks a
    row already committed; default every id of the input."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if work is None:
        work = plan.with_rows().filter(~pl.col("removed"))
    # Only the order is worked out whole (row numbers, shard, revision); the rows themselves
    # are gathered and written some shards at a time, so the messages are never copied whole.
    order = work.select("_row", "id", "shard", "revision").sort("shard", maintain_order=True)
    step = plan.shard_size * _SHARDS_PER_WRITE
    tmp = path.with_name(f".{path.name}.tmp")
    # pyarrow, not polars' writer: polars spends ~15 ms on each small row group of nested
    # rows (30 s at a million prompts), pyarrow well under one.
    writer: pq.ParquetWriter | None = None
    for offset in range(0, max(order.height, 1), step):
        part = order.slice(offset, step)
        rows = prompt_set.valid.select("messages", "tools")[part.get_column("_row")]
        frame = pl.concat([part.select("id", "shard"), rows], how="horizontal").select(
            "id", "shard", conversation_for(turns), "tools", part.get_column("revision")
        )
        table = frame.to_arrow()
        if writer is None:
            writer = pq.ParquetWriter(
                tmp, table.schema, compression="zstd", write_statistics=["shard"]
            )
        writer.write_table(table, row_group_size=plan.shard_size)
    assert writer is not None
    writer.close()
    tmp.replace(path)
    return path


def prompts_for_shard(path: Path, shard: int) -> pl.DataFrame:
    """The prompt rows (id, shard, messages, tools, revision) of one shard, in plan order."""
    return pl.scan_parquet(path).filter(pl.col("shard") == shard).collect()
