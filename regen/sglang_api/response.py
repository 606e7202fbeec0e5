"""Reading SGLang's answers: a completion's fields, or what an error status means for the row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson


class ResponseKind(Enum):
    """What kind of answer an HTTP status is, and so what the dispatcher does with it
    (SGLANG_API.md, error table)."""

    OK = "ok"
    REJECTED = "rejected"  # 4xx: the request itself is wrong; retrying gives the same answer
    UNAUTHORIZED = "unauthorized"  # 401: every request will fail; stop the run
    RETRY = "retry"  # 5xx, or a 200 we cannot read: try again, elsewhere


@dataclass(frozen=True, slots=True)
class Completion:
    """The output-row fields of one chat completion."""

    content: str
    reasoning_content: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    model: str | None
    prompt_token_ids: list[int] | None = None  # the server's own, when it was asked and has them
    response_token_ids: list[int] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """The calls the server's --tool-call-parser found, as regen.schema.TOOL_CALL holds them
    (None: none; SGLang then leaves the key out of the message)."""


def response_kind(status: int) -> ResponseKind:
    if status == 200:
        return ResponseKind.OK
    if status == 401:
        return ResponseKind.UNAUTHORIZED
    if status >= 500 or status in (408, 429):
        return ResponseKind.RETRY
    return ResponseKind.REJECTED


def parse_completion(raw: bytes) -> Completion:
    """Raise ValueError when a 200 body is not a chat completion (treated as retryable)."""
    try:
        # orjson: a completion carries ~1,000s of token ids, which json parses 3x slower.
        data = orjson.loads(raw)
        choice = data["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError) as err:  # orjson's error is a ValueError
        raise ValueError(f"unreadable completion: {type(err).__name__}") from None
    usage: dict[str, Any] = data.get("usage") or {}
    reasoning_tokens = usage.get("reasoning_tokens")
    if reasoning_tokens is None:
        # The OpenAI spelling, for servers other than SGLang behind the same API.
        reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return Completion(
        content=message.get("content") or "",
        reasoning_content=message.get("reasoning_content"),
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        reasoning_tokens=reasoning_tokens,
        model=data.get("model"),
        prompt_token_ids=_ids(choice.get("prompt_token_ids")),
        response_token_ids=_ids(choice.get("response_token_ids")),
        tool_calls=_calls(message.get("tool_calls")),
    )


def _calls(value: Any) -> list[dict[str, Any]] | None:
    """The message's tool calls in TOOL_CALL's shape, kept as the server wrote them (the audit
    judges malformed ones; nothing is dropped here): arguments sent as an object become text."""
    if not isinstance(value, list) or not value:
        return None
    calls = []
    for call in value:
        call = call if isinstance(call, dict) else {}
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {"name": function.get("name"), "arguments": arguments},
            }
        )
    return calls


def _ids(value: Any) -> list[int] | None:
    """The ids as sent, or None where there are none: SGLang omits the key when not asked,
    other servers behind the same API never send it. Elements are checked once per shard,
    in polars, not here per request (see ShardJob)."""
    return value if isinstance(value, list) else None


def error_message(status: int, raw: bytes, limit: int = 500) -> str:
    """`HTTP <status>: <server message>`, truncated because it is stored in every error row."""
    text = raw[: limit * 4].decode("utf-8", errors="replace")
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        found = data.get("message") or data.get("error") or data.get("detail")
        if isinstance(found, dict):
            found = found.get("message")
        if found:
            text = str(found)
    text = " ".join(text.split())
    return f"HTTP {status}: {text[:limit]}" if text else f"HTTP {status}"
