"""The output row contract of DESIGN.md, as one polars schema every writer and reader shares.

A row is one conversation. `messages` is what the final answer was generated on; with
`regeneration.turns: all` it is the whole regenerated conversation, every new assistant turn
included with its `reasoning_content` (null where thinking was dropped or off). `content`,
`reasoning_content` and `finish_reason` are those of the final turn; the token counts,
`attempts` and `latency_s` add up every turn, and `turns` has each turn's own figures (one
entry with `turns: last`). An error row keeps the turns that succeeded; its `error` names the
turn that failed. `tools` is the row's tool definitions as JSON text (regen.tools), null
without; its messages then hold calls (`tool_calls`) and results (role `tool`,
`tool_call_id`). `sampling` is the row's sampling setting and thinking mode, drawn from the
configured mixes (regen.client.setting).
"""

from __future__ import annotations

import polars as pl

TOOL_CALL = pl.Struct(
    {
        "id": pl.String,
        "type": pl.String,
        "function": pl.Struct({"name": pl.String, "arguments": pl.String}),
    }
)
"""One tool call as OpenAI and SGLang write it; `arguments` is JSON text (regen.tools)."""

MESSAGE = pl.Struct(
    {
        "role": pl.String,
        "content": pl.String,
        "tool_calls": pl.List(TOOL_CALL),
        "tool_call_id": pl.String,
    }
)
"""An input message: what the prompt cache holds and what is sent to a server. `tool_calls`
(assistant) and `tool_call_id` (tool) are null on every other message."""

OUTPUT_MESSAGE = pl.Struct(
    {
        "role": pl.String,
        "content": pl.String,
        "reasoning_content": pl.String,
        "tool_calls": pl.List(TOOL_CALL),
        "tool_call_id": pl.String,
    }
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
        "tool_calls": pl.List(TOOL_CALL),
        "tool_stop": pl.String,
        "seed": pl.Int64,
    }
)
"""One generated assistant turn; `turn` counts the conversation's generations from 1 (its user
turns, where no tool is called). `tool_calls` are the calls the server parsed from it
(`finish_reason` then `tool_calls`); `tool_stop` says why the conversation stopped after it,
its calls differing from the given conversation's (regen.tools), null otherwise. `seed` is
the sampling seed its requests carried (regen.client.seed: from `sampling.seed`, the row id and
the turn; every attempt and hedged copy alike), null on turns written before seeds were sent.

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
        "tools": pl.String,
        "sampling": SAMPLING,
    }
    return pl.Schema(columns)
