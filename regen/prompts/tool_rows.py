"""Rows with tools, read into the shapes of regen.tools before polars decodes them.

A tool schema is arbitrary JSON and datasets give a call's arguments as an object as often as
as text, which no polars struct decodes. So the lines that name a tool field (a cheap regex
over the raw text, never matched by text inside a JSON string, where quotes are escaped) are
parsed in Python and written back with `tools` as JSON text and every call normalised; every
other line is left as it was, so a set without tools pays one regex pass.

The layouts mapped: OpenAI `messages` (assistant `tool_calls`, `tool` results, and the legacy
`function_call` / `function` pair), the same turns under `conversations` (SpecForge's layout),
and ShareGPT turns with LLaMA-Factory's speakers `function_call` (the call, a JSON object or a
list of them) and `observation` (its result), or `tool`, beside a `tools` key (a list or its
JSON text). A row whose tool fields cannot be read is rejected with the reason.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from regen.tools import TOOL_ROLES, normalize_calls, normalize_tools

_KEYS = "tools|tool_calls|tool_call_id|function_call|observation|function_response|tool|function"
_TOOLISH = rf'(?:^|[^\\])"(?:{_KEYS})"'
_CALL_SPEAKERS = ("function_call",)


def normalize_tool_lines(raw: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series]:
    """(lines, reason, id): tool lines rewritten; a line that cannot be becomes `{}` with the
    reason and the id it gave (so the reject names both)."""
    n = len(raw)
    reasons = pl.repeat(None, n, dtype=pl.String, eager=True)
    ids = pl.repeat(None, n, dtype=pl.String, eager=True)
    hits = raw.str.contains(_TOOLISH).fill_null(False)
    if not hits.any():
        return raw, reasons, ids
    at = hits.arg_true().to_list()
    lines, why, given = [], [], []
    for line in raw.gather(at).to_list():
        text, reason, row_id = _normalize_line(line)
        lines.append(text)
        why.append(reason)
        given.append(row_id)
    return raw.scatter(at, lines), reasons.scatter(at, why), ids.scatter(at, given)


def _normalize_line(line: str) -> tuple[str, str | None, str | None]:
    try:
        row = json.loads(line)
    except ValueError:
        return line, None, None  # not JSON: the readers say why
    if not isinstance(row, dict):
        return line, None, None
    row_id = row.get("id")
    given = str(row_id) if isinstance(row_id, str | int) and not isinstance(row_id, bool) else None
    try:
        if "tools" in row:
            row["tools"] = normalize_tools(row["tools"])
        if isinstance(row.get("messages"), list):
            row["messages"] = [_message(i, m) for i, m in enumerate(row["messages"])]
        if isinstance(row.get("conversations"), list):
            row["conversations"] = [_turn(i, t) for i, t in enumerate(row["conversations"])]
    except ValueError as err:
        return "{}", str(err), given
    return json.dumps(row, ensure_ascii=False), None, given


def _text(value: Any) -> Any:
    """A tool result given as JSON (an object, a list) becomes its text, as a client sends it."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else value


def _message(i: int, message: Any) -> Any:
    """One OpenAI message (or {role, content} turn) with its tool fields normalised."""
    if not isinstance(message, dict):
        return message
    out = dict(message)
    role = out.get("role")
    if role in TOOL_ROLES:
        out["role"] = "tool"
        out["content"] = _text(out.get("content"))
    calls = out.pop("tool_calls", None)
    legacy = out.pop("function_call", None)
    if calls is None and legacy is not None:
        calls = legacy
    if calls is not None and calls != []:
        if role != "assistant":
            raise ValueError(f"message {i}: tool_calls on a {role} message")
        try:
            out["tool_calls"] = normalize_calls(calls)
        except ValueError as err:
            raise ValueError(f"message {i}: {err}") from None
        if out.get("content") is None:
            out["content"] = ""  # a call with no text beside it, as OpenAI sends it
    return out


def _turn(i: int, turn: Any) -> Any:
    """A `conversations` turn: ShareGPT's {from, value} or {role, content}."""
    if not isinstance(turn, dict) or "from" not in turn:
        return _message(i, turn)
    out = dict(turn)
    speaker = out.get("from")
    if speaker in _CALL_SPEAKERS:
        try:
            out["tool_calls"] = normalize_calls(out.get("value"))
        except ValueError as err:
            raise ValueError(f"message {i}: {speaker}: {err}") from None
        out["value"] = ""
    elif speaker in TOOL_ROLES:
        out["value"] = _text(out.get("value"))
    return out
