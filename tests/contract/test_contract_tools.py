"""Tool calls judged by sglang 0.5.23's own code: the launch flag through its parser, every
tool-call request regen sends through ChatCompletionRequest, the tools as its `Tool` model
hands them to the template (regen.tools.template_tools, which the emulator and the loss mask
render with), and the emulator's answer: its raw call parsed by sglang's own qwen25 / hermes
detectors into the same content and calls, the body a valid ChatCompletionResponse with
`finish_reason: tool_calls`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from regen.config import RegenerationConfig, SamplingConfig
from regen.emulator.tool_calls import call_text, parse
from regen.sglang_api.request import chat_request_body
from regen.tools import normalize_call, sent_messages, template_tools
from tests.contract._sglang import Sglang
from tests.contract.test_contract_protocol import COMMON, KEY, Emu
from tests.support.fleet import SERVED

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "description": "The weather.",
    },
}
BARE = {"type": "function", "function": {"name": "now", "strict": True}}
CALL = normalize_call(
    {"id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "ten"}}}
)
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "s", "tool_calls": None, "tool_call_id": None},
    {"role": "user", "content": "weather?", "tool_calls": None, "tool_call_id": None},
    {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "call_1"},
]


def test_tool_call_parser_flag_is_sglangs(sglang: Sglang) -> None:
    argv = ["--model-path", "/m", "--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3"]
    verdict = sglang.ask("argv", argv=argv)
    assert verdict["ok"], verdict
    bad = sglang.ask("argv", argv=["--model-path", "/m", "--tool-call-parser", "nope"])
    assert not bad["ok"]


def test_a_tool_request_is_a_chat_completion_request(sglang: Sglang) -> None:
    body = chat_request_body(
        SERVED, sent_messages(HISTORY), SamplingConfig(), rid="r-t",
        regeneration=RegenerationConfig(), tools=[WEATHER, BARE],
    )  # fmt: skip
    verdict = sglang.ask("request", body=body)
    assert verdict["ok"], verdict["errors"]
    assert verdict["unknown"] == []
    parsed = verdict["parsed"]
    assert parsed["tool_choice"] == "auto"  # sglang's default with tools: the model decides
    assert parsed["messages"][2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert parsed["messages"][3]["tool_call_id"] == "call_1"


def test_template_tools_are_sglangs_model_dump(sglang: Sglang) -> None:
    tools = [WEATHER, BARE, {"type": "function", "function": {"name": "x", "extra": 1}}]
    assert template_tools(tools) == sglang.ask("tools_dump", tools=tools)


@pytest.mark.parametrize("parser", ["qwen25", "hermes"])
@pytest.mark.parametrize(
    "text",
    [
        "\n\n" + call_text({"name": "get_weather", "arguments": {"city": "ten"}}),
        "Let me look.\n" + call_text({"name": "get_weather", "arguments": {}}),
        "\n\n" + call_text({"name": "unknown_tool", "arguments": {}}),  # dropped: not declared
        "no call here",
    ],
)
def test_the_emulators_parse_is_sglangs(sglang: Sglang, parser: str, text: str) -> None:
    theirs = sglang.ask("tool_parse", parser=parser, text=text, tools=[WEATHER])
    content, calls = parse(text, [WEATHER])
    assert content == theirs["normal"]
    mine = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in calls or []
    ]
    assert mine == theirs["calls"]


@pytest.fixture(scope="module")
def tool_emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    emu = Emu.launch(
        tmp_path_factory.mktemp("emu-tools"), *COMMON, "--emu-time-scale", "0.01",
        "--tool-call-parser", "qwen25", served_name=SERVED, api_key=KEY,
    )  # fmt: skip
    try:
        emu.wait_ready(deadline=time.monotonic() + 60)
        yield emu
    finally:
        emu.stop()


def _ask(emu: Emu, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = chat_request_body(
        SERVED, messages, SamplingConfig(max_tokens=400), regeneration=RegenerationConfig(),
        tools=[WEATHER],
    )  # fmt: skip
    resp = emu.post(body)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_the_emulators_call_is_a_chat_completion_response(sglang: Sglang, tool_emu: Emu) -> None:
    answer = _ask(tool_emu, sent_messages(HISTORY[:2]))
    verdict = sglang.ask("response", kind="chat", body=answer)
    assert verdict["ok"] and verdict["unknown"] == [], verdict
    choice = verdict["parsed"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["index"] == 0 and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "ten"}'}
    assert choice["message"]["content"] == "" and choice["message"]["reasoning_content"]
    # The raw answer the tokens hold parses, with sglang's own parser, to the same call.
    raw = "\n\n" + call_text({"name": "get_weather", "arguments": {"city": "ten"}})
    assert sglang.ask("tool_parse", parser="qwen25", text=raw, tools=[WEATHER])["calls"] == [
        {"name": "get_weather", "arguments": call["function"]["arguments"]}
    ]
    # After the result the model answers in text: no tool_calls key, as 0.5.23 drops a null.
    after = _ask(tool_emu, sent_messages(HISTORY))
    assert "tool_calls" not in after["choices"][0]["message"]
    assert after["choices"][0]["finish_reason"] == "stop"
    assert sglang.ask("response", kind="chat", body=after)["ok"]
    assert json.loads(call["function"]["arguments"]) == {"city": "ten"}
