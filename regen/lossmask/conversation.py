"""Each generated turn of a stored row as the server saw it: the messages sent, the answer.

A row stores its conversation two ways (regen.schema): with `regeneration.turns: last`,
`messages` is the prompt and the answer is `content` / `reasoning_content`; with `all`,
`messages` is the regenerated conversation and holds every answer. Either way the k-th of a
row's turn records is the k-th of its last len(turns) assistant messages. A prompt is what
regen.tools.sent_messages sends (earlier answers without their reasoning, but inside the last
user turn's tool loop; calls and results with their ids), rendered with the row's tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from regen.conversations import turn_number
from regen.tools import sent_messages, template_tools


@dataclass(frozen=True)
class TurnInput:
    """One assistant turn: what the server was sent and what it answered."""

    id: str
    turn: int
    prompt: list[dict[str, Any]]
    answer: dict[str, Any]
    finish_reason: str | None
    reasoning_effort: str | None
    prompt_token_ids: list[int] | None
    response_token_ids: list[int] | None
    """The server's own tokens where stored (null from errors and servers that return none)."""
    enable_thinking: bool | None = None
    """The row's recorded thinking mode (its `sampling` draw); None: the run's."""
    tools: list[dict[str, Any]] | None = None
    """The row's tools as SGLang hands them to the template (regen.tools.template_tools)."""

    @property
    def has_ids(self) -> bool:
        """Both ids stored: the template path is not needed for this turn."""
        return self.prompt_token_ids is not None and self.response_token_ids is not None


def turn_inputs(row: dict[str, Any], only_last: bool = False) -> list[TurnInput]:
    """The turns of one row (a dict of row_schema columns); none for a row without answers.

    A row without turn records (written before they existed) is one turn when it has an
    answer; an error row has answers only in the turns that succeeded.
    """
    messages = [dict(m) for m in row.get("messages") or []]
    records = list(row.get("turns") or [])
    ok = row.get("error") is None
    if ok and (not messages or messages[-1]["role"] != "assistant"):
        messages.append(
            {
                "role": "assistant",
                "content": row.get("content"),
                "reasoning_content": row.get("reasoning_content"),
                # turns=last: the answer's calls are in its turn record only.
                "tool_calls": records[-1].get("tool_calls") if records else None,
            }
        )
    tools = template_tools(json.loads(row["tools"])) if row.get("tools") else None
    if not records and ok:
        # Numbered as the shard job numbers a turn (regen.conversations): its last answer's.
        turn = turn_number(messages[:-1])
        records = [{"turn": turn, "finish_reason": row.get("finish_reason")}]
    answers = [j for j, m in enumerate(messages) if m["role"] == "assistant"]
    if len(answers) < len(records):
        return []  # not a stored layout: no turn can be placed, none is guessed
    pairs = list(zip(answers[len(answers) - len(records) :], records, strict=True))
    if only_last:
        pairs = pairs[-1:]
    return [
        TurnInput(
            id=row["id"],
            turn=record["turn"],
            prompt=sent_messages(messages[:j]),
            answer=_answer(messages[j]),
            finish_reason=record.get("finish_reason"),
            reasoning_effort=record.get("reasoning_effort"),
            prompt_token_ids=record.get("prompt_token_ids"),
            response_token_ids=record.get("response_token_ids"),
            enable_thinking=(row.get("sampling") or {}).get("enable_thinking"),
            tools=tools,
        )
        for j, record in pairs
    ]


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    """The answer as a trainer's conversation holds it; reasoning only when there is some,
    as templates differ on whether a present-but-null key counts as reasoning."""
    out = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out
