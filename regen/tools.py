"""Tool calls: the one owner of their shape, from the input row to the stored turn.

A conversation with tools carries OpenAI's shapes: the row's `tools` (a list of
`{"type": "function", "function": {name, description, parameters}}`), assistant messages with
`tool_calls` (`{id, type, function: {name, arguments}}`, `arguments` a JSON object as text) and
`tool` messages holding a result, with the `tool_call_id` of the call they answer.

In polars (prompts, cache, shards) `tools` is one JSON text per row: a schema is arbitrary JSON,
which no struct type holds; a call is a struct whose `arguments` is text, as OpenAI sends it.

The regeneration rule (`divergence`): assistant turns are regenerated on the history so far and
tool results are kept as given. A result answers the call the given conversation made, so it is
kept only while the model makes that call again: the same number of calls, each with the same
function name and the same arguments (as JSON values). At the first turn where the model's calls
differ from the given ones (or it calls where the given conversation answered, or answers where
it called), the conversation stops there, with what the model generated, and that turn records
why (`TURN.tool_stop`). vLLM speculators' regeneration script stops too, where it runs out of
results to pair.
"""

from __future__ import annotations

import json
from typing import Any

TOOL_ROLES = ("tool", "function", "observation", "function_response")
"""Roles and ShareGPT speakers that carry a tool result; all become `tool`."""

# What sglang 0.5.23's `Function` model keeps of a function, in its field order.
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


def _json(value: Any) -> str:
    """JSON text as SGLang's parser writes a call's arguments (json.dumps defaults)."""
    return json.dumps(value, ensure_ascii=False)


def normalize_tools(value: Any) -> str | None:
    """The row's `tools` as canonical JSON text (None: no tools), ValueError naming the fault.

    Takes a list or its JSON text (the Hermes function-calling layout), of OpenAI tools or of
    bare functions ({name, description, parameters}, as xLAM and LLaMA-Factory rows hold them),
    which are wrapped as function tools. Key order is kept: templates render it as given."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("tools is not valid JSON") from None
    if not isinstance(value, list):
        raise ValueError("tools must be a list of function tools")
    if not value:
        return None
    tools = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise ValueError(f"tools[{i}] is not an object")
        if "function" not in tool:
            tool = {"type": "function", "function": tool}
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise ValueError(f"tools[{i}] is not a function tool")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}]: the function has no name")
        tools.append(tool)
    return _json(tools)


def tool_names(tools: str | None) -> list[str]:
    """The function names of a row's `tools` text."""
    return [t["function"]["name"] for t in json.loads(tools)] if tools else []


def normalize_call(call: Any) -> dict[str, Any]:
    """One call as OpenAI sends it, `{id, type, function: {name, arguments}}`, with `arguments`
    JSON text of an object; takes the bare `{name, arguments}` of ShareGPT's `function_call`
    and arguments given as an object. ValueError naming the fault (SGLang refuses a history
    call whose arguments are not a JSON object, so such a row could never be sent)."""
    if not isinstance(call, dict):
        raise ValueError("a tool call is not an object")
    function = call.get("function", call)
    if not isinstance(function, dict):
        raise ValueError("a tool call's function is not an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call has no function name")
    arguments = function.get("arguments", function.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ValueError(f"the arguments of tool call {name} are not valid JSON") from None
        text = arguments if arguments.strip() else "{}"
    else:
        parsed, text = arguments, _json(arguments)
    if not isinstance(parsed, dict):
        raise ValueError(f"the arguments of tool call {name} are not a JSON object")
    call_id = call.get("id")
    return {
        "id": call_id if isinstance(call_id, str) and call_id else None,
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


def normalize_calls(value: Any) -> list[dict[str, Any]]:
    """A message's `tool_calls` (a list, one call, or their JSON text) as `normalize_call`s."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("tool_calls is not valid JSON") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ValueError("tool_calls must be a list of calls")
    return [normalize_call(c) for c in value]


def template_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools as SGLang 0.5.23 hands them to the chat template: each request tool's
    `Tool.model_dump()` (type, the function's known fields in the client's key order, unset
    description and parameters as null, strict and defer_loading only when set, and the
    tool's own defer_loading). The emulator renders with these, and so does the template
    path of the loss mask: a trainer's render of the same tools must be what the server saw."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function = tool.get("function") or {}
        given = [k for k in function if k in _FUNCTION_FIELDS]
        order = given + [k for k in _FUNCTION_FIELDS if k not in given]
        dumped = {k: function.get(k) for k in order}
        for optional in ("strict", "defer_loading"):
            if dumped.get(optional) is None:
                dumped.pop(optional, None)
        out.append(
            {
                "type": tool.get("type", "function"),
                "function": dumped,
                "defer_loading": tool.get("defer_loading"),
            }
        )
    return out


def _arguments(call: dict[str, Any]) -> Any:
    try:
        return json.loads(call["function"]["arguments"] or "{}")
    except (ValueError, TypeError):
        return call["function"]["arguments"]


def _signature(call: dict[str, Any]) -> str:
    text = call["function"]["arguments"] or "{}"
    return f"{call['function']['name']}({text if len(text) <= 60 else text[:57] + '...'})"


def divergence(
    generated: list[dict[str, Any]] | None, given: list[dict[str, Any]] | None
) -> str | None:
    """Why the model's calls of a turn differ from the given conversation's (None: they are the
    same calls, so the given results answer them). `given` None: the given conversation has no
    call here (it answered, or it ended)."""
    generated, given = generated or [], given or []
    if not generated and not given:
        return None
    mine, theirs = ", ".join(map(_signature, generated)), ", ".join(map(_signature, given))
    if not given:
        return f"the model called {mine}; the given conversation has no result for it"
    if not generated:
        return f"the model answered where the given conversation called {theirs}"
    if len(generated) != len(given):
        return (
            f"the model made {len(generated)} call(s) where the given conversation made "
            f"{len(given)}"
        )
    for one, other in zip(generated, given, strict=True):
        same = one["function"]["name"] == other["function"]["name"]
        if not same or _arguments(one) != _arguments(other):
            return (
                f"the model called {_signature(one)} where the given conversation called "
                f"{_signature(other)}"
            )
    return None


def result_ids(
    results: list[dict[str, Any]], given: list[dict[str, Any]], generated: list[dict[str, Any]]
) -> list[str | None]:
    """The `tool_call_id` each given result takes once the model made the same calls: the id
    of the model's call it answers (by the given call's id where it names one, else by
    position), so the history sent next pairs every result with the server's call."""
    by_id = {c["id"]: k for k, c in enumerate(given) if c.get("id")}
    out: list[str | None] = []
    for k, result in enumerate(results):
        at = by_id.get(result.get("tool_call_id") or "", k)
        out.append(generated[at]["id"] if at < len(generated) else result.get("tool_call_id"))
    return out


def sent_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages a request sends for a conversation so far: role and content, a call's
    `tool_calls`, a result's `tool_call_id`; an answer's reasoning only inside the tool loop of
    the last user turn (the assistant messages after the last user message, where a tool
    result follows them), which Qwen3-style templates render back as the model wrote it;
    earlier reasoning is never sent (no such template renders it). Null fields are left out,
    so a conversation without tools is sent exactly as before tools existed. One function for
    the dispatcher and the loss mask's template path alike."""
    last_user = max((k for k, m in enumerate(history) if m["role"] == "user"), default=-1)
    in_loop = any(m["role"] == "tool" for m in history[last_user + 1 :])
    out = []
    for k, m in enumerate(history):
        sent: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            sent["tool_calls"] = m["tool_calls"]
        if m.get("tool_call_id") is not None:
            sent["tool_call_id"] = m["tool_call_id"]
        if in_loop and k > last_user and m["role"] == "assistant" and m.get("reasoning_content"):
            sent["reasoning_content"] = m["reasoning_content"]
        out.append(sent)
    return out
