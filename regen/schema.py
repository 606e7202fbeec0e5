"""The output row contract of DESIGN.md, as one polars schema every writer and reader shares.

A row is one conversation. `messages` is what the final answer was generated on; with
`regeneration.turns: all` it is the whole regenerated conversation, every new assistant turn
included with its `reasoning_content` (null where thinking was dropped or off). `content`,
`reasoning_content` and `finish_reason` are those of the final turn; the token counts,
`attempts` and `latency_s` add up every turn, and `turns` has each turn's own figures (one
entry with `turns: last`). An error row keeps the turns that succeeded; its `error` names the
turn that failed. `sampling` is the row's sampling setting and thinking mode, drawn from the
configured mixes (regen.client.setting).
"""

from __future__ import annotations

import polars as pl

MESSAGE = pl.Struct({"role": pl.String, "content": pl.String})
"""An input message: what the prompt cache holds and what is sent to a server."""

OUTPUT_MESSAGE = pl.Struct(
    {"role": pl.String, "content": pl.String, "reasoning_content": pl.String}
)

TURN = pl.Struct(
    {
        "turn": pl.Int64,
        "finish_reason": pl.String,
        "prompt_tokens": pl.Int64,
        "completion_tokens": pl.Int64,
        "reasoning_tokens": pl.Int64,
        "reasoning_effort": pl.String,
        "server": pl.String,
        "attempts": pl.Int64,
        "latency_s": pl.Float64,
        "prompt_token_ids": pl.List(pl.Int32),
        "response_token_ids": pl.List(pl.Int32),
    }
)
"""One generated assistant turn; `turn` counts user turns from 1.

`prompt_token_ids` and `response_token_ids` are the server's own tokens (SGLang's
`return_token_ids`): the prompt as its chat template rendered it and the tokens it generated,
end-of-turn token included. Null where the server returned none (an error, an older dataset,
a server that does not support it); a trainer's `input_ids` and `loss_mask` come from them."""


SAMPLING = pl.Struct(
    {
        "temperature": pl.Float64,
        "top_p": pl.Float64,
        "top_k": pl.Int64,
        "min_p": pl.Float64,
        "enable_thinking": pl.Boolean,
    }
)
"""What the row's requests were sampled with: its draw from `sampling.mix` and
`regeneration.thinking_mix` (the section's values without a mix), the same for every turn.
Null on rows written before it was recorded."""


def row_schema() -> pl.Schema:
    """Columns of a shard file; `error` is null for a completion, the reason for an error row."""
    # Annotated: mypy would infer dict[str, object] from the mix of struct, list and plain types.
    columns: dict[str, pl.DataType | type[pl.DataType]] = {
        "id": pl.String,
        "shard": pl.Int64,
        "messages": pl.List(OUTPUT_MESSAGE),
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
        "turns": pl.List(TURN),
        "sampling": SAMPLING,
    }
    return pl.Schema(columns)
