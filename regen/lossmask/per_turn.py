"""`samples`: the one loss-mask function, used by the audit and by every export."""

from __future__ import annotations

import polars as pl

from regen.config import Turns
from regen.lossmask.conversation import turn_inputs
from regen.lossmask.ids import TURN_IDS, build_samples, turn_ids
from regen.lossmask.spans import token_ids_from_template
from regen.lossmask.template import ChatTemplate

ROW_COLUMNS = [
    "id", "messages", "content", "reasoning_content", "finish_reason", "error", "turns", "sampling",
    "tools",
]  # fmt: skip
"""The row_schema columns `samples` reads; select these and no text is read twice."""


def lacks_ids(turns: Turns = "each") -> pl.Expr:
    """Rows the ids path leaves a turn of unsampled: a turn record without ids, or (a row
    written before turn records existed) an answer without any record."""
    missing = (
        pl.element().struct.field("prompt_token_ids").is_null()
        | pl.element().struct.field("response_token_ids").is_null()
    )
    records = pl.col("turns")
    if turns == "last":
        gap = records.list.eval(missing).list.last().fill_null(False)
    else:
        gap = records.list.eval(missing).list.any().fill_null(False)
    no_records = records.list.len().fill_null(0) == 0
    return gap | (no_records & pl.col("error").is_null())


def samples(
    rows: pl.DataFrame,
    turns: Turns = "each",
    template: ChatTemplate | None = None,
    *,
    enable_thinking: bool = True,
) -> pl.LazyFrame:
    """Trainer samples of a batch of rows: the server's ids where stored, else the template.

    Columns `id`, `turn`, `input_ids`, `loss_mask`, `seq_len`, `loss_tokens`, one row per
    assistant turn (`each`) or per conversation's last turn (`last`), in row order. A turn
    gets the ids path when it has both ids; otherwise, with a `template`, the template path
    (regen.lossmask.spans); with neither, no sample. `rows` has the ROW_COLUMNS of
    row_schema (`id` and `turns` are enough without a template). `enable_thinking` is
    run.json's (regeneration.thinking != off): it changes the generation prompt Qwen3 renders.
    """
    stored = turn_ids(rows.lazy(), turns)
    if template is None:
        return build_samples(stored)
    need = rows.with_row_index("_row").filter(lacks_ids(turns))
    if need.height == 0:
        return build_samples(stored)
    positions: list[int] = []
    pending = []
    # A batch without `sampling` (a frame of another reader's making) renders with the run's.
    columns = [c for c in ROW_COLUMNS if c in need.columns]
    for row in need.select("_row", *columns).iter_rows(named=True):
        for t in turn_inputs(row, only_last=turns == "last"):
            if not t.has_ids:
                positions.append(row["_row"])
                pending.append(t)
    found = token_ids_from_template(template, pending, enable_thinking)
    rendered = pl.DataFrame(
        {
            "_row": positions,
            "id": [t.id for t in pending],
            "turn": [t.turn for t in pending],
            "prompt_token_ids": [p for p, _ in found],
            "response_token_ids": [r for _, r in found],
        },
        schema=TURN_IDS,
    )
    both = pl.concat([stored, rendered.lazy()]).sort("_row", "turn", maintain_order=True)
    return build_samples(both)
