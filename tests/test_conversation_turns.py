"""One definition of a conversation's turns (regen.conversations), tool loops included, that
the plan, the shard job, the loss mask and the estimate share.

Before, four counts disagreed on a tool loop: the estimate counted one answer a user message,
so a conversation whose model calls a tool and answers on its result (two answers) counted one
(and its "at most" tokens were not a bound); `turns: last` numbered its answer by the user
messages before it while `all` numbered the same answer by every turn before it, and drew its
`reasoning_effort` as turn 1 whatever its number; the loss mask numbered a row without turn
records by its user messages. Here each is held to the one rule: exhaustively on every small
conversation shape, by the real shard job, and end to end on a real emulator with a tool parser.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from regen.client.effort import pick_effort
from regen.client.shard_job import ShardJob
from regen.config import ReasoningEffort
from regen.conversations import Turns, conversation_for, turn_ends, turn_marks, turn_number
from regen.lossmask.conversation import turn_inputs
from regen.preflight.space import PromptFigures
from regen.schema import MESSAGE
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.response import Completion
from tests.test_tool_calls import THE_CALL, WEATHER, _prompts, endpoint, regenerate

__all__ = ["endpoint"]  # the tool-parsing emulator of test_tool_calls, shared

CALL = [{"id": "given", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
KINDS = {"s": "system", "u": "user", "c": "assistant", "a": "assistant", "t": "tool"}


def _message(kind: str) -> dict[str, Any]:
    """One message of a shape: `c` a call, `a` an answer, `t` a result."""
    return {"role": KINDS[kind], "content": kind, "tool_calls": CALL if kind == "c" else None,
            "tool_call_id": "given" if kind == "t" else None}  # fmt: skip


def _shapes(longest: int = 6) -> list[str]:
    """Every conversation shape the prompt rules accept up to `longest` messages: a user
    message somewhere, each result after a call or another result."""
    return [
        "".join(shape)
        for n in range(1, longest + 1)
        for shape in itertools.product("sucat", repeat=n)
        if "u" in shape
        and all(k != "t" or (i > 0 and shape[i - 1] in "ct") for i, k in enumerate(shape))
    ]


def _frame(shapes: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"id": shapes, "messages": [[_message(k) for k in shape] for shape in shapes]},
        schema={"id": pl.String, "messages": pl.List(MESSAGE)},
    )


def _with_tools(shapes: list[str]) -> pl.DataFrame:
    """The shapes as the estimate reads valid rows (no tools: their bytes are not the point)."""
    return _frame(shapes).with_columns(pl.lit(None, pl.String).alias("tools"))


def test_the_rule_in_polars_is_the_rule_in_python() -> None:
    """`turn_marks` (the estimate's, over a million prompts) marks where `turn_ends` (the
    shard job's steps) ends each turn's history, on all 5,661 shapes of up to 6 messages."""
    shapes = _shapes()
    assert len(shapes) == 5661
    marks = _frame(shapes).select(turn_marks(conversation_for("all")))["messages"].to_list()
    for shape, marked in zip(shapes, marks, strict=True):
        ends = turn_ends([_message(k) for k in shape])
        assert [k + 1 for k, end in enumerate(marked) if end] == ends, shape


def _asked(shapes: list[str]) -> dict[str, list[int]]:
    """Drive the real shard job (turns=all) with a model that makes every given call again:
    per shape, the length of the inputs each request was asked on."""
    job = ShardJob(0, _frame(shapes).with_columns(conversation_for("all")), turns="all")
    job.materialize()
    asked: dict[str, list[int]] = {}
    for pos, shape in enumerate(shapes):
        inputs = job.messages[pos]
        asked[shape] = []
        while True:
            at = job._next[pos]  # the inputs this turn's history holds
            asked[shape].append(at)
            # The model's call: the given conversation's next call, if the history is
            # followed by one; an answer otherwise.
            given = inputs[at] if at < len(inputs) and inputs[at]["role"] == "assistant" else None
            calls = None
            if given is not None:
                calls = [{**c, "id": f"call_{at}"} for c in given["tool_calls"]]
            answer = Completion("x", None, "tool_calls" if calls else "stop", 1, 1, 0, "m",
                                tool_calls=calls)  # fmt: skip
            if not job.complete(pos, answer, "server-0", 1, 0.1):
                break
    assert job.future.result(timeout=5)["error"].null_count() == len(shapes)
    return asked


def test_the_shard_job_asks_the_turns_the_rule_lists() -> None:
    """A model that follows the given conversation is asked exactly the turns `turn_ends`
    lists, on exactly those histories; the estimate counts the same answers."""
    shapes = _shapes(5)
    asked = _asked(shapes)
    for shape in shapes:
        assert asked[shape] == turn_ends([_message(k) for k in shape]), shape
    figures = PromptFigures.of(_with_tools(shapes), "all")
    assert figures.answers == sum(len(a) for a in asked.values())


def _tool_loops(row_id: str) -> dict[str, Any]:
    """Two user messages, each answered by a call, its result and an answer: four turns."""
    call = {"id": "given-1", "type": "function", "function": THE_CALL}
    loop = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "given-1", "content": {"temp": 20}},
        {"role": "assistant", "content": "It is 20 degrees."},
    ]
    return {"id": row_id, "tools": [WEATHER], "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in ten?"},
        *loop,
        {"role": "user", "content": "and tomorrow?"},
        *loop,
    ]}  # fmt: skip


def test_a_tool_loop_is_turns_to_the_estimate_the_shard_job_and_the_loss_mask(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """The emulator calls after a user message and answers after a result: on a conversation
    whose two user messages each start a tool loop, it makes every given call again, and
    turns=all generates four answers. The estimate counted two (one a user message); it
    counts four now, and the loss mask trains four samples numbered as the shard job numbers
    them."""
    valid = _prompts(tmp_path, _tool_loops("loops"))
    out = regenerate(endpoint, valid, "all")
    (row,) = out.iter_rows(named=True)
    assert row["error"] is None
    assert [t["turn"] for t in row["turns"]] == [1, 2, 3, 4]
    assert [t["tool_stop"] for t in row["turns"]] == [None] * 4
    assert PromptFigures.of(valid, "all").answers == 4
    (messages,) = valid["messages"].to_list()
    assert len(turn_ends(messages)) == 4
    assert [t.turn for t in turn_inputs(row)] == [1, 2, 3, 4]


def test_a_last_answer_is_numbered_and_drawn_as_all_numbers_it(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """turns=last answers after the second result: the conversation's fourth turn, as `all`
    numbers it, and its effort is that turn's draw (it was turn 2 by its user messages, and
    drawn as turn 1)."""
    row = _tool_loops("last")
    row["messages"] = row["messages"][:-1]  # ends on the second result
    valid = _prompts(tmp_path, row)
    shares: dict[ReasoningEffort, float] = {"low": 0.5, "high": 0.5}
    out = regenerate(endpoint, valid, "last")
    (done,) = out.iter_rows(named=True)
    assert done["error"] is None
    ((messages,),) = valid.select(conversation_for("last")).rows()
    assert turn_number(messages) == 4
    (record,) = done["turns"]
    assert record["turn"] == 4
    # The loss mask numbers a row written before turn records existed the same way.
    legacy = {**done, "turns": None, "tools": json.dumps([WEATHER])}
    assert [t.turn for t in turn_inputs(legacy)] == [4]
    # The effort: the draw of the turn as numbered, with last as with all.
    job = ShardJob(0, valid.select("id", conversation_for("last")), efforts=shares)
    job.materialize()
    assert job.effort(0) == pick_effort(shares, "last", 4)


@pytest.mark.parametrize("turns", ["last", "all"])
def test_a_conversation_without_tools_counts_as_before(turns: Turns) -> None:
    """No tool loop, no change: a turn a user message, `last` numbered by its user messages."""
    shapes = ["su", "suau", "suauu", "suaua"]
    figures = PromptFigures.of(_with_tools(shapes), turns)
    users = [shape.count("u") for shape in shapes]
    assert figures.answers == (sum(users) if turns == "all" else len(shapes))
    assert [turn_number([_message(k) for k in shape]) for shape in shapes] == users
