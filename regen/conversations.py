"""What a conversation becomes before generation, by `regeneration.turns`.

`last` answers the conversation's last input: everything up to its last user message or tool
result is kept as given (earlier answers and calls included), and the assistant messages after
it are the answer being replaced. `all` regenerates every assistant turn, so none of the
original answers is kept: the conversation is its system and user messages, its tool results,
and the given assistant messages that call tools, kept only so that the model's own calls can
be compared with them (regen.tools: a result is kept while the model makes the same call);
they are never sent. The dispatcher rebuilds the assistant turns one by one. Ids are computed
before this, on the conversation as given.

A conversation that ends on an assistant call with no tool result after it (xLAM's rows,
Glaive's in LLaMA-Factory's layout: a query and the call that answers it) is regenerated at
that turn, never sent as it is (a request ending on an unanswered call asks the model to go on
from a call nothing answered): `last` cuts the call as any answer after the last input and
answers the user message before it; `all` generates the model's turn there, and when the model
makes the same call, nothing answers it, so the conversation ends on the model's call
(`regen.client.shard_job`); another call or an answer stops it there, as anywhere else.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

Turns = Literal["last", "all"]


def conversation_for(turns: Turns, messages: str = "messages") -> pl.Expr:
    """The `messages` column as generation needs it (see the module docstring)."""
    msgs = pl.col(messages)
    role = pl.element().struct.field("role")
    if turns == "all":
        calls = pl.element().struct.field("tool_calls").list.len().fill_null(0) > 0
        return msgs.list.eval(pl.element().filter((role != "assistant") | calls))
    is_input = role.is_in(["user", "tool"])
    last_input = msgs.list.eval(pl.int_range(pl.len()).filter(is_input).max()).list.first()
    return msgs.list.head(last_input + 1)
