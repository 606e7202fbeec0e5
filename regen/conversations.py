"""What a conversation becomes before generation, by `regeneration.turns`.

`last` answers the final user turn: assistant messages after it are the answer being replaced.
`all` regenerates every assistant turn, so none of the original answers is kept: the
conversation is its system and user messages, and the dispatcher rebuilds the assistant turns
one by one. Ids are computed before this, on the conversation as given.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

Turns = Literal["last", "all"]


def conversation_for(turns: Turns, messages: str = "messages") -> pl.Expr:
    """The `messages` column as generation needs it (see the module docstring)."""
    msgs = pl.col(messages)
    is_user = pl.element().struct.field("role") == "user"
    if turns == "all":
        return msgs.list.eval(pl.element().filter(pl.element().struct.field("role") != "assistant"))
    last_user = msgs.list.eval(pl.int_range(pl.len()).filter(is_user).max()).list.first()
    return msgs.list.head(last_user + 1)
