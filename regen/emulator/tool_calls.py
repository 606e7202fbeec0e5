"""Tool calls as the emulated model makes them and SGLang 0.5.23 reports them.

The model is an agent of one rule: with tools in the request (and a `--tool-call-parser` it
can write for), a history that ends with a user message is answered with one call, a history
that ends with a tool result with text. The call is fixed by (history, seed): one of the
request's tools, its declared parameters filled by type. It is written in the Qwen2.5/Qwen3
and Hermes format, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, which the
Qwen3 template renders back the same way (so the next turn's prompt repeats the model's
tokens), after the thinking block.

`parse` is serving_chat's `_process_tool_calls` over the `qwen25` detector
(sglang/srt/function_call/qwen25_detector.py): the text before the first `<tool_call>\\n`,
stripped, stays the content; each block's JSON becomes a call with a fresh `call_` id, its
arguments re-dumped with json.dumps's defaults; a call to a tool the request does not declare
is dropped, as is a block that is not JSON; with any call a `stop` becomes `tool_calls` and
`matched_stop` null. tests/contract runs sglang's own parser on the same text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from regen.emulator.model import unit

PARSERS = ("qwen25", "qwen", "hermes")
"""The --tool-call-parser formats the emulator writes and parses (one format)."""
BOT, EOT = "<tool_call>\n", "\n</tool_call>"
_BLOCK = re.compile(rf"{re.escape(BOT)}(.*?){re.escape(EOT)}", re.DOTALL)
_VALUES: dict[str, Any] = {"string": "ten", "integer": 10, "number": 10, "boolean": True}


def calls_now(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, parser: str | None
) -> bool:
    """Whether the model answers this history with a call."""
    return bool(tools) and parser in PARSERS and bool(messages) and messages[-1]["role"] == "user"


def call_for(tools: list[dict[str, Any]], digest: str, seed: int) -> dict[str, Any]:
    """The model's call for a history: {name, arguments} (arguments an object)."""
    tool = tools[int(unit(seed, "tool", digest) * len(tools))]
    function = tool.get("function") or {}
    properties = (function.get("parameters") or {}).get("properties") or {}
    arguments = {
        key: _VALUES.get(str(spec.get("type")) if isinstance(spec, dict) else "", "ten")
        for key, spec in properties.items()
    }
    return {"name": function.get("name"), "arguments": arguments}


def call_text(call: dict[str, Any]) -> str:
    """The call as the model writes it (and the Qwen3 template renders it back)."""
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    return f'{BOT}{{"name": "{call["name"]}", "arguments": {arguments}}}{EOT}'


def parse(content: str, tools: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]] | None]:
    """(content, tool_calls) as SGLang reports them; tool_calls None where no call parsed."""
    if BOT not in content:
        return content, None
    normal = content[: content.find(BOT)].strip()
    names = {(t.get("function") or {}).get("name") for t in tools}
    calls: list[dict[str, Any]] = []
    for block in _BLOCK.findall(content):
        try:
            action = json.loads(block.strip())
        except ValueError:
            continue
        for act in action if isinstance(action, list) else [action]:
            if not isinstance(act, dict) or act.get("name") not in names:
                continue  # "Model attempted to call undefined function": skipped
            arguments = act.get("parameters") or act.get("arguments", {})
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "index": len(calls),
                    "type": "function",
                    "function": {
                        "name": act["name"],
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
    return normal, calls or None
