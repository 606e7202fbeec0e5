"""A conversation's turns: what is generated, on which history, and how many answers that is.

The one definition the plan (`conversation_for`), the shard job (`regen.client.shard_job`),
the loss mask (`regen.lossmask.conversation`) and the estimate (`regen.preflight.space`)
share. A turn is one generated assistant message, a call included: a tool loop is turns.

What a conversation becomes before generation, by `regeneration.turns`: `last` answers the
conversation's last input: everything up to its last user message or tool result is kept as
given (earlier answers and calls included), and the assistant messages after it are the
answer being replaced. `all` regenerates every assistant turn, so none of the original answers
is kept: the conversation is its system and user messages, its tool results, and the given
assistant messages that call tools (its inputs), kept only so that the model's own calls can be
compared with them (regen.tools: a result is kept while the model makes the same call); they
are never sent. Ids are computed before this, on the conversation as given.

The turns of `all`, on its inputs: the first is asked on everything up to and with the first
user message (all of it where there is none). After a turn, where the given conversation
called tools next and results follow the call, the model's same call keeps those results and
the next turn is asked on them (a step of the tool loop); otherwise the next turn is asked at
the next user message, and there is none after the last. So a conversation has one turn a user
message plus one a tool loop step: `turn_ends` counts them as the model would go if it made
every given call again, the most turns a row can have (another call, or an answer where the
given conversation called, stops the conversation there, `regen.tools.divergence`). A turn's
number is its place in that order, from 1, with `last` too: its one answer is the
conversation's last turn, numbered as `all` numbers it.

A conversation that ends on an assistant call with no tool result after it (xLAM's rows,
Glaive's in LLaMA-Factory's layout: a query and the call that answers it) is regenerated at
that turn, never sent as it is (a request ending on an unanswered call asks the model to go on
from a call nothing answered): `last` cuts the call as any answer after the last input and
answers the user message before it; `all` generates the model's turn there, and when the model
makes the same call, nothing answers it, so the conversation ends on the model's call; another
call or an answer stops it there, as anywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import polars as pl

Turns = Literal["last", "all"]

Message = Mapping[str, Any]
M = TypeVar("M", bound=Message)


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


def inputs_of(messages: Sequence[M]) -> list[M]:
    """A conversation's inputs, as `conversation_for("all")` keeps them: every message but
    the given answers (an assistant message without calls)."""
    return [m for m in messages if m["role"] != "assistant" or m.get("tool_calls")]


def first_turn_end(inputs: Sequence[Message]) -> int:
    """The inputs the first turn is asked on: up to and with the first user message, or all
    of them in a conversation without one."""
    return user_turn_end(inputs, 0) or len(inputs)


def user_turn_end(inputs: Sequence[Message], start: int) -> int | None:
    """The inputs from `start` a turn at the next user message is asked on: up to and with
    it; None when no user message is left (the conversation ends)."""
    return next((k + 1 for k in range(start, len(inputs)) if inputs[k]["role"] == "user"), None)


def given_call(inputs: Sequence[Message], at: int) -> Message | None:
    """The given conversation's call at `at`, the input after a turn's history, that the
    model's call of that turn is compared with; None where it has none (it answered)."""
    return inputs[at] if at < len(inputs) and inputs[at]["role"] == "assistant" else None


def results_end(inputs: Sequence[Message], at: int) -> int:
    """The end of the tool results after the given call at `at` (`at + 1`: none follow)."""
    end = at + 1
    while end < len(inputs) and inputs[end]["role"] == "tool":
        end += 1
    return end


def turn_ends(messages: Sequence[Message]) -> list[int]:
    """Each turn of a conversation with `turns: all`, as the length of the inputs
    (`inputs_of`) it is asked on, the model making every given call again: one a user
    message and one a tool loop step, the most a row has (see the module docstring)."""
    inputs = inputs_of(messages)
    ends = [first_turn_end(inputs)]
    while True:
        at = ends[-1]
        if given_call(inputs, at) is not None:
            end = results_end(inputs, at)
            if end > at + 1:
                ends.append(end)
                continue
            at = end  # an unanswered call: the next user turn follows
        end_or_none = user_turn_end(inputs, at)
        if end_or_none is None:
            return ends
        ends.append(end_or_none)


def turn_number(messages: Sequence[Message]) -> int:
    """The number of the turn asked on `messages` (a `turns: last` prompt, or the history
    before a stored answer): its conversation's turns so far, tool loop steps included."""
    return len(turn_ends(messages))


def turn_marks(inputs: pl.Expr) -> pl.Expr:
    """`turn_ends` for a column of inputs (`conversation_for("all")`), in polars: per row, a
    list as long as the inputs, true at the last input of each turn's history.

    A user message ends a turn's history; so does the last of a run of tool results when the
    run answers a given call made right after a turn (after a user message, or after the
    results of the step before): the chain of (call, results) that follows a user message.
    A conversation without a user message is one turn on all of it."""
    role = pl.element().struct.field("role")
    user = role == "user"
    before, after = role.shift(1), role.shift(-1)
    # Each input after a user message keeps the chain going: a call after the user message
    # or a result, a result after a call or a result.
    chained = user | ((role == "assistant") & before.is_in(["user", "tool"])) | (
        (role == "tool") & before.is_in(["assistant", "tool"])
    )
    breaks = (~chained).cast(pl.Int32).cum_sum()
    in_chain = breaks == pl.when(user).then(breaks).forward_fill()
    seen_user = user.cum_sum() > 0
    step = (role == "tool") & (after.fill_null("") != "tool") & in_chain & seen_user
    no_user = ~user.any() & (pl.int_range(pl.len()) == pl.len() - 1)
    return inputs.list.eval(user | step.fill_null(False) | no_user)
