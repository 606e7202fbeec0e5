"""Tool-call rows as real data has them: conversations that end on an assistant call with no
tool result (the xLAM shape in OpenAI messages, Glaive's in LLaMA-Factory's ShareGPT turns).

The rule (regen.conversations): such a call is the answer being regenerated. `turns: last`
cuts it as any answer after the last input and answers the user message before it; `turns:
all` generates the model's own turn there and ends the conversation after it when nothing
answers that call. Never is a request sent that ends on an unanswered call. Real emulator
(`--tool-call-parser qwen25`), the real dispatcher, the server's own token ids checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows.cli import main
from regen.config import load_config
from regen.conversations import Turns
from regen.preflight import check_prompts
from regen.sglang_api.endpoint import Endpoint
from regen.tools import sent_messages, template_tools
from tests.support.ids import rendered
from tests.test_rehearsal_guards import _node
from tests.test_tool_calls import THE_CALL, WEATHER, _prompts, endpoint, regenerate

__all__ = ["endpoint"]  # the emulator fixture of test_tool_calls, shared

pytestmark = pytest.mark.timeout(120)


def _xlam(row_id: str, call: dict[str, Any]) -> dict[str, Any]:
    """xLAM's shape as OpenAI messages: a query, and the calls that answer it, no result."""
    return {
        "id": row_id,
        "tools": [WEATHER],
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather in ten?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
        ],
    }


def _glaive(row_id: str, call: dict[str, Any]) -> dict[str, Any]:
    """Glaive's shape as LLaMA-Factory writes it: ShareGPT turns ending on a function_call."""
    return {
        "id": row_id,
        "tools": json.dumps([WEATHER]),
        "conversations": [
            {"from": "human", "value": "weather in ten?"},
            {"from": "function_call", "value": json.dumps(call)},
        ],
    }


def _sent_histories(row: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The history each generated turn was asked on: the stored conversation up to each
    assistant message the model wrote (turns=all), or the whole of it (turns=last)."""
    messages = row["messages"]
    if len(row["turns"]) == 1 and (not messages or messages[-1]["role"] != "assistant"):
        return [messages]
    at = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    return [messages[:k] for k in at][-len(row["turns"]) :]


@pytest.mark.parametrize("turns", ["last", "all"])
@pytest.mark.parametrize("shape", [_xlam, _glaive])
def test_a_conversation_ending_on_an_unanswered_call_regenerates_that_turn(
    endpoint: Endpoint, tmp_path: Path, turns: Turns, shape: Any
) -> None:
    """The model makes the given call (the emulator's THE_CALL): nothing answers it, so the
    row ends on the model's call, generated once, and no request ended on a call."""
    other = {"name": "get_weather", "arguments": {"city": "nine"}}
    valid = _prompts(tmp_path, shape("same", THE_CALL), shape("other", other))
    out = regenerate(endpoint, valid, turns)
    tools = template_tools([WEATHER])
    for row in out.iter_rows(named=True):
        assert row["error"] is None, row["error"]
        (turn,) = row["turns"]  # one answer: the call's turn, never one after it
        assert turn["finish_reason"] == "tool_calls" and turn["tool_calls"]
        (history,) = _sent_histories(row)
        assert history[-1]["role"] == "user", [m["role"] for m in history]
        sent = sent_messages(history)
        assert turn["prompt_token_ids"] == rendered(sent, True, tools=tools, enable_thinking=True)
        if turns == "all":
            assert row["messages"][-1]["tool_calls"] == turn["tool_calls"]
        else:
            assert not any(m["tool_calls"] for m in row["messages"]), "the given call was sent"
    stops = {r["id"]: r["turns"][0]["tool_stop"] for r in out.iter_rows(named=True)}
    # The given call was the model's own: nothing stopped. Another call is said, not hidden.
    assert stops["same"] is None
    assert (stops["other"] is not None) == (turns == "all")


def test_an_unanswered_call_inside_a_conversation_goes_on_at_the_next_user_turn(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """turns=all: the model makes the given call, which no result answers, and the user speaks
    again: the next turn is asked on that user message, never on the call."""
    row = _xlam("mid", THE_CALL)
    row["messages"].append({"role": "user", "content": "thanks; and tomorrow?"})
    out = regenerate(endpoint, _prompts(tmp_path, row), "all")
    (done,) = out.iter_rows(named=True)
    assert done["error"] is None
    assert [m["role"] for m in done["messages"]] == [
        "system", "user", "assistant", "user", "assistant",
    ]  # fmt: skip
    histories = _sent_histories(done)
    assert [h[-1]["role"] for h in histories] == ["user", "user"]
    tools = template_tools([WEATHER])
    for turn, history in zip(done["turns"], histories, strict=True):
        sent = sent_messages(history)
        assert turn["prompt_token_ids"] == rendered(sent, True, tools=tools, enable_thinking=True)


def test_rows_with_tools_and_no_parser_fail_check_and_rehearse_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `--tool-call-parser` SGLang leaves a call as text in the answer: the prompts
    row fails naming the setting, in `regen check` and in `regen rehearse` (same words, before
    the rehearsal starts anything)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")  # each row on one line
    rows = [_xlam("a", THE_CALL), _glaive("b", THE_CALL)]
    rows.append({"id": "c", "messages": [{"role": "user", "content": "no tools here"}]})
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _node(tmp_path / "node.yaml", "out/node")

    def prompts_row(verb: str) -> str:
        assert main([verb, "--config", str(config)]) == 1
        (row,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│ prompts ")]
        return " ".join(row.split())

    checked = prompts_row("check")
    assert "fail" in checked and "2 have tools and engine.tool_call_parser is not set" in checked
    assert "SGLang's --tool-call-parser" in checked
    assert prompts_row("rehearse") == checked
    assert not (tmp_path / ".regen").exists(), "the rehearsal started"
    parsed = _node(tmp_path / "parsed.yaml", "out/node", **{"engine.tool_call_parser": "qwen25"})
    row = check_prompts(load_config(parsed))
    assert row.status == "pass" and "3 of 3 rows valid" in row.figure, row
