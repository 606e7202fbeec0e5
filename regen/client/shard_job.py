"""One submitted shard: its rows as the dispatcher needs them, and its output columns.

Rows stay in their polars frame until the shard reaches the head of the queue, so a
flow that submits all 2,000 shards of a 1M-prompt run at once holds Arrow buffers, not
a million Python dicts; the Python lists exist only for the shards being dispatched.

With `regeneration.turns: all` a row is a conversation generated turn by turn: `complete`
appends the answer to the row's history and says whether another user turn follows, which
the dispatcher then sends at once. Per row only the history, the turn number and the
per-turn records are kept (see `regen.schema` for what the finished row holds).
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Mapping
from typing import Any, TypedDict

import polars as pl

from regen.client.effort import pick_effort
from regen.client.seed import turn_seed
from regen.client.setting import SettingDraw
from regen.client.shard_frame import (
    ID_COLUMNS,
    RESULT_COLUMNS,
    conversation_frame,
    last_turn_frame,
)
from regen.config import ReasoningEffort
from regen.conversations import (
    Turns,
    first_turn_end,
    given_call,
    inputs_of,
    results_end,
    turn_number,
    user_turn_end,
)
from regen.sglang_api.request import RowSetting
from regen.sglang_api.response import Completion
from regen.tools import divergence, result_ids, sent_messages


class _HistoryMessage(TypedDict):
    """One message of a turns=all conversation, shaped as `OUTPUT_MESSAGE`: only answers
    carry reasoning, so `content` is always text while `reasoning_content` may be None; only
    calls carry `tool_calls`, only results `tool_call_id`."""

    role: str
    content: str
    reasoning_content: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None


class ShardJob:
    """Filled from the dispatcher's loop thread only; `future` is read by the shard's thread."""

    __slots__ = (
        "_all",
        "_columns",
        "_efforts",
        "_frame",
        "_history",
        "_keep_reasoning",
        "_next",
        "_records",
        "_seed",
        "_setting",
        "_settings",
        "_sums",
        "_tools",
        "cursor",
        "future",
        "ids",
        "messages",
        "remaining",
        "shard",
        "turn",
    )

    def __init__(
        self,
        shard: int,
        rows: pl.DataFrame,
        *,
        turns: Turns = "last",
        keep_reasoning: bool = True,
        efforts: Mapping[ReasoningEffort, float] | None = None,
        setting: SettingDraw | None = None,
        seed: int | None = None,
    ) -> None:
        missing = {"id", "messages"} - set(rows.columns)
        if missing:
            raise ValueError(f"shard {shard}: rows lack column(s) {sorted(missing)}")
        self.shard = shard
        # `tools` (regen.tools: JSON text per row) is absent from frames of older callers.
        self._frame = rows.select("id", "messages", *(["tools"] if "tools" in rows.columns else []))
        self._tools: list[list[dict[str, Any]] | None] = []
        self.future: concurrent.futures.Future[pl.DataFrame] = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()
        self.remaining = rows.height
        self.cursor = 0
        self.ids: list[str] = []
        self.messages: list[list[dict[str, Any]]] = []
        self._columns: dict[str, list[Any]] = {}
        self._all = turns == "all"
        # thinking: drop still thinks, but nothing of it is stored.
        self._keep_reasoning = keep_reasoning
        self._efforts = dict(efforts or {})
        self._setting = setting
        self._seed = seed
        self._settings: list[RowSetting | None] = []
        # turns=all only, per row: the conversation so far (output messages), the index of
        # the next input message, the current turn (from 1), TURN records, running sums.
        self._history: list[list[_HistoryMessage]] = []
        self._next: list[int] = []
        self.turn: list[int] = []
        self._records: list[list[dict[str, Any]]] = []
        self._sums: list[dict[str, Any]] = []
        if not self.size:
            self.materialize()
            self.future.set_result(self._result())

    @property
    def size(self) -> int:
        return self._frame.height

    def materialize(self) -> None:
        """Turn the frame into the Python lists requests are built from (once, at the head)."""
        if self._columns:
            return
        self.ids = self._frame["id"].to_list()
        self.messages = self._frame["messages"].to_list()
        tools = self._frame["tools"].to_list() if "tools" in self._frame.columns else []
        self._tools = [json.loads(t) if t else None for t in tools] or [None] * self.size
        draw = self._setting
        self._settings = [draw(i) if draw else None for i in self.ids]
        self._columns = {
            name: [None] * self.size for name in (*RESULT_COLUMNS, *ID_COLUMNS, "tool_calls")
        }
        if self._all:
            n = self.size
            # Defensive: the original answers are stripped upstream, never sent if not; the
            # given calls stay, to be compared with the model's (regen.tools), never sent.
            self.messages = [inputs_of(ms) for ms in self.messages]
            self._history = [[] for _ in range(n)]
            self._next = [0] * n
            self.turn = [0] * n
            self._records = [[] for _ in range(n)]
            self._sums = [
                {"prompt_tokens": None, "completion_tokens": None, "reasoning_tokens": None,
                 "attempts": 0, "latency_s": 0.0}
                for _ in range(n)
            ]  # fmt: skip
            for pos in range(n):
                self._advance(pos)

    def _advance(self, pos: int) -> bool:
        """Move the next input messages up to and including a user message into the history;
        False when no user turn is left (regen.conversations: a row without any user message
        gets one turn)."""
        inputs, start = self.messages[pos], self._next[pos]
        end = user_turn_end(inputs, start) if self.turn[pos] else first_turn_end(inputs)
        if end is None:
            return False  # only trailing non-user messages: nothing more to answer
        self._history[pos].extend(_as_history(m) for m in inputs[start:end])
        self._next[pos] = end
        self.turn[pos] += 1
        return True

    def prompt(self, pos: int) -> list[dict[str, str]]:
        """What the next request of row `pos` sends: earlier answers without their reasoning,
        as the chat template takes no earlier reasoning."""
        history: list[Any] = self._history[pos] if self._all else self.messages[pos]
        return sent_messages(history)

    def tools(self, pos: int) -> list[dict[str, Any]] | None:
        """Row `pos`'s tools, sent with each of its requests (None: it has none)."""
        return self._tools[pos] if self._tools else None

    def turn_of(self, pos: int) -> int:
        """Which request of row `pos` this is: 1 for its first (`turns: last` sends one)."""
        return self.turn[pos] if self._all else 1

    def number_of(self, pos: int) -> int:
        """The conversation's number of the turn row `pos` is asked now (regen.conversations):
        with `turns: last` its last turn, numbered as `all` numbers it."""
        return self.turn[pos] if self._all else turn_number(self.messages[pos])

    def effort(self, pos: int) -> ReasoningEffort | None:
        """The `reasoning_effort` of row `pos`'s current turn (None: send none): one draw a
        turn of the conversation, so its last answer draws alike with `last` and `all`."""
        return pick_effort(self._efforts, self.ids[pos], self.number_of(pos))

    def seed(self, pos: int) -> int | None:
        """The sampling seed of row `pos`'s current turn (None: the run sends none)."""
        if self._seed is None:
            return None
        return turn_seed(self._seed, self.ids[pos], self.turn_of(pos))

    def setting(self, pos: int) -> RowSetting | None:
        """Row `pos`'s sampling setting and thinking mode (None: the dispatcher's own)."""
        return self._settings[pos]

    def is_open(self) -> bool:
        return not self.future.done()

    def complete(
        self, pos: int, completion: Completion, server: str, attempts: int, latency_s: float
    ) -> bool:
        """Record one answered turn; True when the row has another turn to send."""
        c = self._columns
        reasoning = completion.reasoning_content if self._keep_reasoning else None
        # The response ids hold the reasoning too: where it is not kept, neither are they.
        response_ids = completion.response_token_ids if self._keep_reasoning else None
        prompt_tokens = completion.prompt_tokens
        completion_tokens = completion.completion_tokens
        reasoning_tokens = completion.reasoning_tokens
        if self._all:
            self._records[pos].append(
                {
                    "turn": self.turn[pos],
                    "finish_reason": completion.finish_reason,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "reasoning_tokens": reasoning_tokens,
                    "reasoning_effort": self.effort(pos),
                    "server": server,
                    "attempts": attempts,
                    "latency_s": latency_s,
                    "prompt_token_ids": completion.prompt_token_ids,
                    "response_token_ids": response_ids,
                    "tool_calls": completion.tool_calls,
                    "tool_stop": None,
                    "seed": self.seed(pos),
                }
            )
            self._history[pos].append(
                {
                    "role": "assistant",
                    "content": completion.content,
                    "reasoning_content": reasoning,
                    "tool_calls": completion.tool_calls,
                    "tool_call_id": None,
                }
            )
            sums = self._add(pos, attempts, latency_s, completion)
            if self._next_step(pos, completion.tool_calls):
                return True
            prompt_tokens = sums["prompt_tokens"]
            completion_tokens = sums["completion_tokens"]
            reasoning_tokens = sums["reasoning_tokens"]
            attempts, latency_s = sums["attempts"], sums["latency_s"]
        c["content"][pos] = completion.content
        c["reasoning_content"][pos] = reasoning
        c["finish_reason"][pos] = completion.finish_reason
        c["prompt_tokens"][pos] = prompt_tokens
        c["completion_tokens"][pos] = completion_tokens
        c["reasoning_tokens"][pos] = reasoning_tokens
        c["model"][pos] = completion.model
        c["prompt_token_ids"][pos] = completion.prompt_token_ids
        c["response_token_ids"][pos] = response_ids
        c["tool_calls"][pos] = completion.tool_calls
        self._finish(pos, server, attempts, latency_s, None)
        return False

    def _next_step(self, pos: int, calls: list[dict[str, Any]] | None) -> bool:
        """After a generated turn: True when the row has another turn to send.

        Where the model called tools or the given conversation did, the rule of regen.tools
        decides: the same calls keep the given results (paired with the model's call ids)
        and the model goes on from them; other calls stop the conversation here, the turn
        recording why. Otherwise the next user turn follows, if there is one. A given call
        that no result follows (the xLAM/Glaive shape, a conversation ending on its call)
        answers nothing: the model's same call ends the tool loop there, and the next user
        turn follows if there is one, so no request ends on an unanswered call."""
        inputs, at = self.messages[pos], self._next[pos]
        given = given_call(inputs, at)
        if not calls and given is None:
            return self._advance(pos)
        why = divergence(calls, given["tool_calls"] if given else None)
        if why is not None or given is None or not calls:
            self._records[pos][-1]["tool_stop"] = why
            return False
        end = results_end(inputs, at)
        results = inputs[at + 1 : end]
        if not results:
            self._next[pos] = end
            return self._advance(pos)
        ids = result_ids(results, given["tool_calls"], calls)
        self._history[pos].extend(
            {**_as_history(m), "tool_call_id": call_id}
            for m, call_id in zip(results, ids, strict=True)
        )
        self._next[pos] = end
        self.turn[pos] += 1
        return True

    def _add(
        self, pos: int, attempts: int, latency_s: float | None, completion: Completion | None
    ) -> dict[str, Any]:
        """Add one turn to the row's sums; a token count stays null only if no turn had it."""
        sums = self._sums[pos]
        sums["attempts"] += attempts
        sums["latency_s"] += latency_s or 0.0
        if completion is not None:
            for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
                value = getattr(completion, name)
                if value is not None:
                    sums[name] = (sums[name] or 0) + value
        return sums

    def fail(
        self, pos: int, error: str, server: str | None, attempts: int, latency_s: float | None
    ) -> None:
        """A failed turn ends the conversation; the row keeps the turns that succeeded."""
        if self._all:
            sums = self._add(pos, attempts, latency_s, None)
            c = self._columns
            for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
                c[name][pos] = sums[name]
            attempts, latency_s = sums["attempts"], sums["latency_s"]
            error = f"turn {self.turn[pos]}: {error}"
        self._finish(pos, server, attempts, latency_s, error)

    def _finish(
        self,
        pos: int,
        server: str | None,
        attempts: int,
        latency_s: float | None,
        error: str | None,
    ) -> None:
        c = self._columns
        c["server"][pos] = server
        c["attempts"][pos] = attempts
        c["latency_s"][pos] = latency_s
        c["error"][pos] = error
        self.remaining -= 1
        if self.remaining == 0 and self.is_open():
            try:
                self.future.set_result(self._result())
            except Exception as err:  # e.g. messages of another shape: fail, never hang
                self.future.set_exception(err)
            self.release()

    def abort(self, error: BaseException) -> None:
        if self.is_open():
            self.future.set_exception(error)
        self.release()

    def release(self) -> None:
        """Drop the per-row Python objects once nothing will be dispatched from this shard."""
        self.ids = []
        self.messages = []
        self._columns = {}
        self._history = []
        self._next = []
        self.turn = []
        self._records = []
        self._sums = []
        self._tools = []
        self._settings = []

    def _result(self) -> pl.DataFrame:
        sampling = [s.record() if s is not None else None for s in self._settings]
        if self._all:
            return conversation_frame(
                self._frame, self.shard, self._columns, self._history, self._records, sampling
            )
        positions = range(self.size)
        return last_turn_frame(
            self._frame,
            self.shard,
            self._columns,
            sampling,
            turns=[self.number_of(pos) for pos in positions],
            efforts=[self.effort(pos) for pos in positions],
            seeds=[self.seed(pos) for pos in positions],
        )


def _as_history(message: dict[str, Any]) -> _HistoryMessage:
    """An input message as the conversation's history holds it."""
    return {
        "role": message["role"],
        "content": message["content"],
        "reasoning_content": None,
        "tool_calls": message.get("tool_calls"),
        "tool_call_id": message.get("tool_call_id"),
    }
