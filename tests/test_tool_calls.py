"""Tool-call conversations end to end on a real emulator (`--tool-call-parser qwen25`): rows
with `tools`, assistant `tool_calls` and `tool` results are read, the tools go with every
request, the model's calls come back parsed, each turn stores the server's ids, its calls and
`finish_reason: tool_calls`, and the regeneration rule of regen.tools holds: the given results
are kept while the model makes the given call, the conversation stops where it does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from pydantic import SecretStr

from regen.audit.checks.tool_calls import tool_calls_check
from regen.audit.loss_mask import ModelTemplate
from regen.audit.settings import AuditSettings
from regen.audit.summary import audit_rows
from regen.client import Dispatcher, DispatchTuning
from regen.config import AuditConfig, GenerationConfig, RegenerationConfig, SamplingConfig
from regen.conversations import Turns, conversation_for
from regen.emulator import history_digest
from regen.emulator.tool_calls import call_for
from regen.lossmask import load_template, samples
from regen.prompts import load_prompts
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.tools import divergence, normalize_call, sent_messages, template_tools
from support.emulator import MODEL_DIR, emulators
from tests.support.ids import TOKENIZER, rendered

pytestmark = pytest.mark.timeout(120)

MODEL = "emu-model"
KEY = "test-key"
SEED = 0
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
# What the emulated model calls get_weather with (its parameters filled by type).
THE_CALL = {"name": "get_weather", "arguments": {"city": "ten", "days": 10}}


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    flags = [
        "--max-running-requests", "4", "--context-length", "2048",
        "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25", "--emu-load-s", "0",
        "--emu-time-scale", "0.05", "--emu-reasoning-tokens", "5:20",
        "--emu-answer-tokens", "20:40", "--emu-seed", str(SEED),
    ]  # fmt: skip
    with emulators(tmp_path_factory.mktemp("emu"), [flags], served_name=MODEL, api_key=KEY) as (
        emu,
    ):
        yield Endpoint(0, emu.url)


def _row(row_id: str, given_call: dict[str, Any], *, second_user: bool = True) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in ten?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "given-1", "type": "function", "function": given_call}],
        },
        {"role": "tool", "tool_call_id": "given-1", "content": {"temp": 20}},
        {"role": "assistant", "content": "It is 20 degrees."},
    ]
    if second_user:
        messages += [{"role": "user", "content": "and a third?"}]
    return {"id": row_id, "tools": [WEATHER], "messages": messages}


def _prompts(tmp_path: Path, *rows: dict[str, Any]) -> pl.DataFrame:
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ps = load_prompts(str(path))
    assert ps.rejects.height == 0, ps.rejects.rows()
    return ps.valid


def regenerate(endpoint: Endpoint, valid: pl.DataFrame, turns: Turns) -> pl.DataFrame:
    rows = valid.select("id", conversation_for(turns), "tools")
    dispatcher = Dispatcher(
        [endpoint],
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=256),
        generation=GenerationConfig(),
        concurrency_per_server=2,
        regeneration=RegenerationConfig(turns=turns, thinking="save"),
        tuning=DispatchTuning(retry_backoff_s=0.02, probe_backoff_s=0.2),
    )
    with dispatcher:
        return dispatcher.submit_shard(0, rows).result(timeout=90)


def test_tool_rows_are_read_in_openai_and_sharegpt_layouts(tmp_path: Path) -> None:
    """OpenAI messages (arguments as an object, a result as JSON) and LLaMA-Factory's ShareGPT
    speakers `function_call` / `observation` beside a `tools` text read as the same chat."""
    sharegpt = {
        "id": "s",
        "tools": json.dumps([WEATHER["function"]]),
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "weather in ten?"},
            {"from": "function_call", "value": json.dumps(THE_CALL)},
            {"from": "observation", "value": '{"temp": 20}'},
            {"from": "gpt", "value": "It is 20 degrees."},
        ],
    }
    valid = _prompts(tmp_path, _row("m", THE_CALL, second_user=False), sharegpt)
    tools = valid["tools"].to_list()
    assert tools[0] == tools[1] == json.dumps([WEATHER])
    one, two = valid["messages"].to_list()
    assert [m["role"] for m in one] == ["system", "user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in two] == [m["role"] for m in one]
    assert one[2]["content"] == "" and one[3]["content"] == '{"temp": 20}'
    assert one[2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "ten", "days": 10}',
    }
    assert two[2]["tool_calls"][0]["function"] == one[2]["tool_calls"][0]["function"]
    # Ids are content hashes that see the calls: another argument, another id.
    other = _prompts(tmp_path, {k: v for k, v in _row("", {**THE_CALL}).items() if k != "id"})
    changed = _row("", {"name": "get_weather", "arguments": {"city": "nine"}})
    assert (
        other["id"][0]
        != _prompts(tmp_path, {k: v for k, v in changed.items() if k != "id"})["id"][0]
    )


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]},
            "message 1: a tool result must follow an assistant message with tool_calls",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                    },
                ]
            },
            "message 1: the arguments of tool call f are not a JSON object",
        ),
        (
            {"tools": [{"type": "function", "function": {}}], "prompt": "q"},
            "tools[0]: the function has no name",
        ),
        (
            {
                "conversations": [
                    {"from": "human", "value": "q"},
                    {"from": "function_call", "value": "x"},
                ]
            },
            "message 1: function_call: tool_calls is not valid JSON",
        ),
    ],
)
def test_a_malformed_tool_row_is_rejected_with_its_reason(
    tmp_path: Path, row: dict[str, Any], reason: str
) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"id": "ok", "messages": [{"role": "user", "content": "hi"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"id": "bad", **row}) + "\n")
    ps = load_prompts(str(path))
    assert ps.valid["id"].to_list() == ["ok"]
    assert ps.rejects.rows() == [(2, "bad", reason)]


def test_the_same_call_keeps_the_given_result_and_goes_on(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """turns=all: the model calls get_weather as the given conversation did, so the given
    result answers it (paired with the server's call id), the model answers on it, and the
    next user turn follows. Each turn stores the server's ids, the tools went with each
    request, and a call turn's finish_reason is tool_calls."""
    out = regenerate(endpoint, _prompts(tmp_path, _row("same", THE_CALL)), "all")
    assert out.schema == row_schema()
    (row,) = out.iter_rows(named=True)
    assert row["error"] is None
    messages, turns = row["messages"], row["turns"]
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "assistant", "user", "assistant",
    ]  # fmt: skip
    call = messages[2]["tool_calls"][0]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == THE_CALL["arguments"]
    assert messages[2]["content"] == "" and messages[2]["reasoning_content"]
    assert messages[3] == {
        "role": "tool",
        "content": '{"temp": 20}',
        "reasoning_content": None,
        "tool_calls": None,
        "tool_call_id": call["id"],  # the given result, paired with the model's own call
    }
    assert [t["turn"] for t in turns] == [1, 2, 3]
    # The third turn calls again (a user message ends its history): the given conversation
    # ends there, so there is no result for it and the conversation ends with that call.
    assert [t["finish_reason"] for t in turns] == ["tool_calls", "stop", "tool_calls"]
    assert turns[0]["tool_calls"] == messages[2]["tool_calls"]
    assert turns[1]["tool_calls"] is None and turns[2]["tool_calls"] == messages[6]["tool_calls"]
    assert [t["tool_stop"] for t in turns[:2]] == [None, None]
    assert turns[2]["tool_stop"] == (
        'the model called get_weather({"city": "ten", "days": 10}); '
        "the given conversation has no result for it"
    )
    assert row["tools"] == json.dumps([WEATHER])
    tools = template_tools([WEATHER])
    at = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    for turn, k in zip(turns, at, strict=True):
        sent = sent_messages(messages[:k])
        # What the server rendered: the history as sent, the tools in the system block.
        assert turn["prompt_token_ids"] == rendered(sent, True, tools=tools, enable_thinking=True)
        assert turn["completion_tokens"] == len(turn["response_token_ids"])
    # The answer after the result was asked on the call with its reasoning (the tool loop of
    # the last user turn), the result, and nothing of the given answer.
    sent = sent_messages(messages[: at[1]])
    assert sent[2]["reasoning_content"] == messages[2]["reasoning_content"]
    assert messages[4]["content"].startswith(f"\n\n[history:{history_digest(sent)}]")
    # A later user turn's history carries no earlier reasoning.
    assert "reasoning_content" not in sent_messages(messages[: at[2]])[2]


def test_another_call_stops_the_conversation_there(endpoint: Endpoint, tmp_path: Path) -> None:
    """The given conversation called get_weather for another city: its result does not answer
    the model's call, so the row ends with the model's call, the turn saying why."""
    other = {"name": "get_weather", "arguments": {"city": "nine"}}
    out = regenerate(endpoint, _prompts(tmp_path, _row("other", other)), "all")
    (row,) = out.iter_rows(named=True)
    assert row["error"] is None
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    (turn,) = row["turns"]
    assert turn["finish_reason"] == row["finish_reason"] == "tool_calls"
    assert turn["tool_stop"] == (
        'the model called get_weather({"city": "ten", "days": 10}) where the given '
        'conversation called get_weather({"city": "nine"})'
    )


def test_turns_last_answers_after_the_given_result(endpoint: Endpoint, tmp_path: Path) -> None:
    """turns=last: everything up to the last input (here the given call and its result) is
    kept as given and sent; the model answers the result in text, with the tools sent."""
    valid = _prompts(
        tmp_path, _row("last", {"name": "get_weather", "arguments": {}}, second_user=False)
    )
    out = regenerate(endpoint, valid, "last")
    (row,) = out.iter_rows(named=True)
    assert row["error"] is None and row["finish_reason"] == "stop"
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool"]
    assert row["messages"][2]["tool_calls"][0]["id"] == "given-1"
    (turn,) = row["turns"]
    assert turn["tool_calls"] is None and turn["tool_stop"] is None
    sent = sent_messages(row["messages"])
    assert sent[2]["tool_calls"][0]["id"] == "given-1" and sent[3]["tool_call_id"] == "given-1"
    assert turn["prompt_token_ids"] == rendered(
        sent, True, tools=template_tools([WEATHER]), enable_thinking=True
    )


def test_the_rule_compares_names_counts_and_arguments_as_json() -> None:
    mine = [normalize_call({"name": "f", "arguments": '{"a": 1, "b": [2]}'})]
    assert (
        divergence(mine, [normalize_call({"name": "f", "arguments": {"b": [2], "a": 1}})]) is None
    )
    assert "called g" in (divergence(mine, [normalize_call({"name": "g", "arguments": {}})]) or "")
    assert "2 call(s)" in (divergence(mine * 2, mine) or "")
    assert "answered" in (divergence(None, mine) or "")
    assert "no result" in (divergence(mine, None) or "")


def test_the_emulators_call_is_fixed_by_history_and_tools() -> None:
    assert call_for([WEATHER], "0123abcd", SEED) == THE_CALL


def test_the_loss_mask_trains_the_calls_never_the_results(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """One sample per generated turn: its prompt (the given result included) masked, its
    response (the model's call) trained. The template path, which renders the stored
    conversation with its tools, gives the server's ids exactly."""
    out = regenerate(endpoint, _prompts(tmp_path, _row("mask", THE_CALL)), "all")
    template, _ = load_template(MODEL_DIR)
    assert template is not None
    from_ids = samples(out, "each").collect()
    assert from_ids["turn"].to_list() == [1, 2, 3]
    call_turn, answer_turn = from_ids.row(0, named=True), from_ids.row(1, named=True)
    trained = [i for i, m in zip(call_turn["input_ids"], call_turn["loss_mask"], strict=True) if m]
    call_ids = TOKENIZER.encode("<tool_call>", add_special_tokens=False).ids
    assert call_ids[0] in trained  # the call is the model's own: trained
    result = TOKENIZER.encode("<tool_response>", add_special_tokens=False).ids[0]
    ids, mask = answer_turn["input_ids"], answer_turn["loss_mask"]
    assert result in ids and not mask[ids.index(result)]  # the given result: never trained
    assert call_ids[0] in ids and not mask[ids.index(call_ids[0])]  # an earlier call: context
    # The template path (ids dropped) renders the same tokens and mask.
    no_ids = out.with_columns(
        pl.col("turns").list.eval(
            pl.element().struct.with_fields(
                pl.lit(None, pl.List(pl.Int32)).alias("prompt_token_ids"),
                pl.lit(None, pl.List(pl.Int32)).alias("response_token_ids"),
            )
        )
    )
    rendered_samples = samples(no_ids, "each", template, enable_thinking=True).collect()
    assert (
        rendered_samples.select("input_ids", "loss_mask").rows()
        == from_ids.select("input_ids", "loss_mask").rows()
    )


def test_the_audit_counts_bad_calls_and_stopped_conversations(
    endpoint: Endpoint, tmp_path: Path
) -> None:
    """The tool_calls check over stored tool turns: the model's own calls pass; a call whose
    arguments are no JSON object, one to an undeclared tool and a call block the parser dropped
    (its token in the response, no call) are each counted; conversations the rule stopped are
    named."""
    other = {"name": "get_weather", "arguments": {"city": "nine"}}
    out = regenerate(endpoint, _prompts(tmp_path, _row("a", THE_CALL), _row("b", other)), "all")
    model = ModelTemplate(load_template(MODEL_DIR)[0], "", True)
    settings = AuditSettings(AuditConfig(), True, model, 0)
    good = audit_rows(out, settings).tools
    assert (good.rows, good.turns, good.calls) == (2, 4, 3)
    assert good.malformed.n == good.unknown.n == good.dropped.n == 0
    assert good.stopped.n == 2 and [e.id for e in good.stopped.examples] == ["a#t3", "b"]
    assert tool_calls_check(good, AuditConfig()).status == "pass"

    def broken(call: dict[str, Any], extra_block: bool = False) -> dict[str, Any]:
        def fix(turn: dict[str, Any]) -> dict[str, Any]:
            if not turn["tool_calls"]:
                return turn
            ids = turn["response_token_ids"] + (call_ids if extra_block else [])
            return {**turn, "tool_calls": [call], "response_token_ids": ids}

        return {"turns": [fix(t) for t in out.row(0, named=True)["turns"]]}

    call_ids = TOKENIZER.encode("<tool_call>", add_special_tokens=False).ids
    bad = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "[1]"}}
    unknown = {"id": "c", "type": "function", "function": {"name": "nope", "arguments": "{}"}}
    rows = pl.concat(
        [
            out.head(1).with_columns(
                pl.Series("turns", [broken(call, block)["turns"]], out.schema["turns"])
            )
            for call, block in ((bad, False), (unknown, True))
        ]
    )
    found = audit_rows(rows, settings).tools
    assert (found.malformed.n, found.unknown.n, found.dropped.n) == (2, 2, 2)
    assert (
        found.malformed.examples[0].reason == "the arguments of get_weather are not a JSON object"
    )
    check = tool_calls_check(found, AuditConfig())
    assert check.status == "fail" and check.figure == pytest.approx(6 / 6)


def test_a_parquet_file_with_tools_reads_as_jsonl_does(tmp_path: Path) -> None:
    """Parquet: `tools` as JSON text (the Hermes function-calling layout) and messages whose
    calls are structs with text arguments."""
    row = _row("p", THE_CALL, second_user=False)
    jsonl = _prompts(tmp_path, row)
    frame = pl.DataFrame(
        {
            "id": ["p"],
            "tools": [json.dumps(row["tools"])],
            "messages": [jsonl["messages"][0]],
        }
    )
    frame.write_parquet(tmp_path / "tools.parquet")
    ps = load_prompts(str(tmp_path / "tools.parquet"))
    assert ps.rejects.height == 0
    assert (
        ps.valid.select("id", "messages", "tools").rows()
        == jsonl.select("id", "messages", "tools").rows()
    )
