"""Which prompts the canary sends: an even stride over the rows of every pending shard.

Even, not random: the same plan always gives the same sample (a resumed run finds its canary
rows already stored), and a stride over rows in plan order touches every shard and every part
of the input, where a defect tied to one source file or one prompt format would hide from a
sample drawn from the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl


def canary_sample(prompt_cache: Path, shards: Sequence[int], size: int) -> pl.DataFrame:
    """`size` prompt rows (id, shard, messages) evenly spread over `shards`, in plan order.

    Row i of the pending rows (n of them) is taken when `(i * size) % n < size`: exactly
    `size` rows, one in every n/size. Fewer rows than `size` are all taken; 0 takes none.
    """
    pending = pl.scan_parquet(prompt_cache).filter(pl.col("shard").is_in(list(shards)))
    if size <= 0:
        return pending.head(0).collect()
    n = pl.len()
    return (
        pending.with_row_index("_i")
        .filter((pl.col("_i").cast(pl.Int64) * size) % pl.max_horizontal(n, 1) < size)
        .drop("_i")
        .collect()
    )
