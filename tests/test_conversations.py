"""`regeneration.turns` against a real emulator: `all` regenerates every assistant turn on the
regenerated history, `last` answers once; `thinking: drop` stores no reasoning anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest
from pydantic import SecretStr

from regen.client import Dispatcher, DispatchTuning
from regen.client.effort import pick_effort
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.emulator import history_digest
from regen.schema import MESSAGE, row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import chat_request_body
from support.emulator import emulators
from tests.support.ids import IM_END, rendered, response_ids

pytestmark = pytest.mark.timeout(120)

MODEL = "emu-model"
KEY = "test-key"
CONTEXT = 1024


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """One thinking emulator; a small context so a long user turn is rejected (a 400)."""
    flags = [
        "--max-running-requests", "4", "--context-length", str(CONTEXT),
        "--reasoning-parser", "qwen3", "--emu-load-s", "0", "--emu-tokens-per-s", "250",
        "--emu-time-scale", "0.05", "--emu-reasoning-tokens", "5:20",
        "--emu-answer-tokens", "20:40",
    ]  # fmt: skip
    logs = tmp_path_factory.mktemp("emu")
    with emulators(logs, [flags], served_name=MODEL, api_key=KEY) as (emu,):
        yield Endpoint(0, emu.url)


def regenerate(endpoint: Endpoint, rows: pl.DataFrame, **regeneration: Any) -> pl.DataFrame:
    dispatcher = Dispatcher(
        [endpoint],
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=128),
        generation=GenerationConfig(),
        concurrency_per_server=2,
        regeneration=RegenerationConfig.model_validate(regeneration),
        tuning=DispatchTuning(retry_backoff_s=0.02, probe_backoff_s=0.2),
    )
    with dispatcher:
        return dispatcher.submit_shard(3, rows).result(timeout=90)


def conversations(count: int, third: str = "and a third?") -> pl.DataFrame:
    """System + 3 user turns; an original assistant answer sits in between (stripped upstream
    for turns=all, here to prove it is ignored anyway)."""
    messages = [
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"first question {i}?"},
            {"role": "assistant", "content": "ORIGINAL ANSWER"},
            {"role": "user", "content": "a second one?"},
            {"role": "user", "content": third},
        ]
        for i in range(count)
    ]
    return pl.DataFrame(
        {"id": [f"c-{i}" for i in range(count)], "messages": messages},
        schema={"id": pl.String, "messages": pl.List(MESSAGE)},
    )


def test_all_turns_regenerate_the_whole_conversation(endpoint: Endpoint) -> None:
    rows = conversations(5)
    out = regenerate(endpoint, rows, turns="all", thinking="save")
    assert out.schema == row_schema()
    assert out["id"].to_list() == rows["id"].to_list()
    assert out["error"].null_count() == out.height
    for row in out.iter_rows(named=True):
        messages, turns = row["messages"], row["turns"]
        roles = [m["role"] for m in messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
        answers = [m for m in messages if m["role"] == "assistant"]
        assert all(a["content"] and a["content"] != "ORIGINAL ANSWER" for a in answers)
        assert all(a["reasoning_content"] for a in answers)
        assert [m["reasoning_content"] for m in messages if m["role"] != "assistant"] == [None] * 4
        assert [t["turn"] for t in turns] == [1, 2, 3]
        # The emulator tags each answer with a digest of the history it was asked on: each
        # turn saw the regenerated conversation so far (no original answer, no reasoning).
        # Each turn keeps the server's ids: its prompt is the template's rendering of that
        # history, earlier answers included, and its response the tokens of its answer.
        asked = iter(turns)
        for at, message in enumerate(messages):
            if message["role"] == "assistant":
                seen = [{"role": m["role"], "content": m["content"]} for m in messages[:at]]
                assert message["content"].startswith(f"\n\n[history:{history_digest(seen)}]")
                turn = next(asked)
                assert turn["prompt_token_ids"] == rendered(seen, True, enable_thinking=True)
                assert turn["response_token_ids"] == response_ids(
                    message["reasoning_content"], message["content"]
                )
                assert turn["prompt_tokens"] == len(turn["prompt_token_ids"])
                assert turn["completion_tokens"] == len(turn["response_token_ids"])
        prompts = [t["prompt_tokens"] for t in turns]
        assert prompts[0] < prompts[1] < prompts[2]
        assert row["content"] == answers[-1]["content"]
        assert row["reasoning_content"] == answers[-1]["reasoning_content"]
        assert row["finish_reason"] == turns[-1]["finish_reason"]
        assert row["prompt_tokens"] == sum(prompts)
        assert row["completion_tokens"] == sum(t["completion_tokens"] for t in turns)
        assert row["attempts"] == sum(t["attempts"] for t in turns) == 3
        assert row["latency_s"] == pytest.approx(sum(t["latency_s"] for t in turns))


def test_drop_stores_no_reasoning_in_either_mode(endpoint: Endpoint) -> None:
    for turns in ("all", "last"):
        out = regenerate(endpoint, conversations(3), turns=turns, thinking="drop")
        assert out["error"].null_count() == out.height
        assert out["reasoning_content"].null_count() == out.height
        stored = out["messages"].explode().struct.field("reasoning_content")
        assert stored.null_count() == stored.len()
        assert (out["reasoning_tokens"] > 0).all()  # it still thought
        # The response ids hold the reasoning too: dropped with it. The prompt ids stay.
        ids = out["turns"].explode().struct.unnest()
        assert ids["response_token_ids"].null_count() == ids.height
        assert ids["prompt_token_ids"].null_count() == 0


def test_last_answers_once(endpoint: Endpoint) -> None:
    rows = conversations(3)
    out = regenerate(endpoint, rows, turns="last", thinking="save")
    assert out["error"].null_count() == out.height
    assert out["messages"].list.len().to_list() == [5, 5, 5]
    assert out["turns"].list.len().to_list() == [1, 1, 1]
    assert out["turns"].list.first().struct.field("turn").to_list() == [3, 3, 3]
    assert out["reasoning_content"].null_count() == 0
    for row in out.iter_rows(named=True):
        # The prompt as given, the original answer included, rendered by the template.
        (turn,) = row["turns"]
        assert turn["prompt_token_ids"] == rendered(row["messages"], True, enable_thinking=True)
        assert turn["response_token_ids"] == response_ids(row["reasoning_content"], row["content"])


def test_token_ids_false_asks_for_none_and_stores_null(endpoint: Endpoint) -> None:
    off = RegenerationConfig(token_ids=False)
    assert "return_token_ids" not in chat_request_body(
        MODEL, [], SamplingConfig(), regeneration=off
    )
    on = chat_request_body(MODEL, [], SamplingConfig(), regeneration=RegenerationConfig())
    assert on["return_token_ids"] is True
    # Probes and fleet benches pass no regeneration: they store nothing and ask for no ids.
    assert "return_token_ids" not in chat_request_body(MODEL, [], SamplingConfig())
    for turns in ("all", "last"):
        out = regenerate(endpoint, conversations(2), turns=turns, token_ids=False)
        assert out["error"].null_count() == out.height
        stored = out["turns"].explode().struct.unnest()
        assert stored.height == (6 if turns == "all" else 2)
        assert stored["prompt_token_ids"].null_count() == stored.height
        assert stored["response_token_ids"].null_count() == stored.height


def test_a_failed_turn_ends_the_conversation_and_keeps_the_turns_before(
    endpoint: Endpoint,
) -> None:
    too_long = " ".join(["word"] * (CONTEXT * 2))
    out = regenerate(endpoint, conversations(2, third=too_long), turns="all")
    for row in out.iter_rows(named=True):
        assert row["error"].startswith("turn 3: ")
        assert "context length" in row["error"]
        assert [t["turn"] for t in row["turns"]] == [1, 2]
        # The turns that succeeded keep their ids; the failed one has no record at all.
        assert all(t["response_token_ids"][-1] == IM_END for t in row["turns"])
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        assert row["content"] is None
        assert row["prompt_tokens"] == sum(t["prompt_tokens"] for t in row["turns"])
        assert row["attempts"] == 3
    # turns=last: the error row has no turn, so no ids anywhere (no training sample).
    last = regenerate(endpoint, conversations(2, third=too_long), turns="last")
    assert last["error"].null_count() == 0
    assert last["turns"].list.len().to_list() == [0, 0]


@pytest.mark.parametrize("turns", ["all", "last"])
def test_each_turn_records_the_effort_its_id_and_turn_pick(endpoint: Endpoint, turns: str) -> None:
    shares = {"low": 0.4, "medium": 0.4, "high": 0.2}
    out = regenerate(endpoint, conversations(12), turns=turns, reasoning_effort=shares)
    assert out["error"].null_count() == out.height  # the emulator took every effort it was sent
    picked = out.select("id", "turns").explode("turns").unnest("turns")
    for sample_id, turn, effort in picked.select("id", "turn", "reasoning_effort").iter_rows():
        # One draw a turn of the conversation: `last`'s answer is its turn 3, drawn as such.
        assert effort == pick_effort(shares, sample_id, turn)
    assert picked["reasoning_effort"].null_count() == 0


def test_no_shares_send_no_effort(endpoint: Endpoint) -> None:
    out = regenerate(endpoint, conversations(2), turns="all")
    assert (
        out["turns"].list.eval(pl.element().struct.field("reasoning_effort")).explode().null_count()
        == 6
    )
    body = chat_request_body(MODEL, [{"role": "user", "content": "q"}], SamplingConfig())
    assert "reasoning_effort" not in body


@pytest.mark.parametrize(("thinking", "sent"), [("save", True), ("drop", True), ("off", False)])
def test_thinking_mode_sets_enable_thinking_in_the_request(thinking: str, sent: bool) -> None:
    regeneration = RegenerationConfig.model_validate({"thinking": thinking})
    body = chat_request_body(
        MODEL, [{"role": "user", "content": "q"}], SamplingConfig(), regeneration=regeneration
    )
    # drop still thinks (and separates the reasoning so it can be dropped); off asks for none.
    assert body["chat_template_kwargs"] == {"enable_thinking": sent}
    assert body["separate_reasoning"] is True
