"""Tool calls on the real SGLang 0.5.23 server (the lane's `one_server`, the tiny twin on this
CPU): launched with `--tool-call-parser qwen25` from `engine.tool_call_parser` by regen's own
fleet code, it takes regen's tool request (the row's tools, a history with a call and its
result) and renders it to the very prompt ids the emulator and the loss mask's template path
render (regen.tools.template_tools and sent_messages over the bundled Qwen3-style template).
The tiny model's planted answer calls no tool: its answer comes back without `tool_calls`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from regen.config import RegenerationConfig, SamplingConfig
from regen.lossmask import load_template
from regen.sglang_api.request import chat_request_body
from regen.tools import normalize_call, sent_messages, template_tools
from support.engine import HANG_GUARD_S

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = normalize_call(
    {"id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "ten"}}}
)
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "the weather in ten?"},
    {"role": "assistant", "content": "", "reasoning_content": "let me check", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "call_1"},
]


@pytest.mark.parametrize("upto", [2, 4], ids=["a question", "a call and its result"])
def test_the_real_server_renders_tools_as_regen_does(
    one_server: tuple[str, str], tiny_model: Path, upto: int
) -> None:
    url, key = one_server
    messages = sent_messages(HISTORY[:upto])
    body = chat_request_body(
        "qwen3-emu", messages, SamplingConfig(max_tokens=8), rid=f"tools-{upto}",
        regeneration=RegenerationConfig(), tools=[WEATHER],
    )  # fmt: skip
    body["model"] = "tiny"
    resp = httpx.post(
        f"{url}/v1/chat/completions", json=body, timeout=HANG_GUARD_S,
        headers={"Authorization": f"Bearer {key}"},
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    template, _ = load_template(tiny_model)
    assert template is not None
    tools = template_tools([WEATHER])
    text = template.render(messages, add_generation_prompt=True, tools=tools, enable_thinking=True)
    mine = template.encode([text])[0]
    assert choice["prompt_token_ids"] == mine, json.dumps(choice)[:400]
    assert "tool_calls" not in choice["message"]  # the planted answer calls nothing
