"""The prompt cache of a run's shard tasks: each task reads only its own shard's prompts.

Written once per run beside the work dir (not in the dataset root), one row group per shard,
so a filtered scan skips every other shard's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from regen.conversations import Turns, conversation_for
from regen.dataset.plan import ShardPlan

if TYPE_CHECKING:  # only read: regen.prompts may use this package's keys
    from regen.prompts import PromptSet


def cache_prompts(
    prompt_set: PromptSet, plan: ShardPlan, path: Path, turns: Turns = "last"
) -> Path:
    """Write id, shard, messages once, one row group per shard. `messages` is already what
    generation sends (`regen.conversations`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = prompt_set.valid.select(
        "id", plan.assignments.get_column("shard"), conversation_for(turns)
    )
    tmp = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(tmp, compression="zstd", row_group_size=plan.shard_size, statistics=True)
    tmp.replace(path)
    return path


def prompts_for_shard(path: Path, shard: int) -> pl.DataFrame:
    """The prompt rows (id, shard, messages) of one shard, in plan order."""
    return pl.scan_parquet(path).filter(pl.col("shard") == shard).collect()
