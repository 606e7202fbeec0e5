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
    prompt_set: PromptSet,
    plan: ShardPlan,
    path: Path,
    turns: Turns = "last",
    *,
    work: pl.DataFrame | None = None,
) -> Path:
    """Write id, shard, messages, revision once, in shard order, one row group per shard.
    `messages` is already what generation sends (`regen.conversations`); `revision` is the
    input revision of the row's content. `work` (id, shard) limits the cache to those rows:
    what the run may send, so a sample of the cache (the canary) never picks a row already
    committed; default every id of the input."""
    path.parent.mkdir(parents=True, exist_ok=True)
    planned = plan.assignments.select("id", "shard", "revision")
    if work is not None:
        planned = planned.join(work.select("id"), on="id", how="semi")
    frame = (
        prompt_set.valid.select("id", conversation_for(turns))
        .join(planned, on="id", maintain_order="left")
        .sort("shard", maintain_order=True)
        .select("id", "shard", "messages", "revision")
    )
    tmp = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(tmp, compression="zstd", row_group_size=plan.shard_size, statistics=True)
    tmp.replace(path)
    return path


def prompts_for_shard(path: Path, shard: int) -> pl.DataFrame:
    """The prompt rows (id, shard, messages, revision) of one shard, in plan order."""
    return pl.scan_parquet(path).filter(pl.col("shard") == shard).collect()
