"""The one loss-mask function: the template path on a real Qwen3 chat template, and the
choice between it and the server's stored ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from regen.errors import UserError
from regen.lossmask import load_template, samples
from regen.lossmask.conversation import turn_inputs
from regen.lossmask.parity import prompt_differences
from regen.lossmask.template import ChatTemplate
from regen.schema import row_schema
from tests.support.lossmask import QWEN3_TEMPLATE, qwen3_model_dir

WORDS = ["Hi", "Why?", "Because.", "More?", "Sure.", "hmm", "ok", "so", "done."]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> ChatTemplate:
    template, why = load_template(qwen3_model_dir(tmp_path_factory.mktemp("qwen3"), WORDS))
    assert template is not None, why
    return template


def _turn(n: int, finish: str = "stop", ids: tuple[list[int], list[int]] | None = None) -> dict:
    return {
        "turn": n, "finish_reason": finish, "prompt_tokens": 1, "completion_tokens": 1,
        "reasoning_tokens": 0, "reasoning_effort": None, "server": "s", "attempts": 1,
        "latency_s": 0.1, "prompt_token_ids": ids[0] if ids else None,
        "response_token_ids": ids[1] if ids else None,
    }  # fmt: skip


def _row(ident: str, messages: list[dict], turns: list[dict], **answer: Any) -> dict:
    last: dict[str, Any] = next((m for m in reversed(messages) if m["role"] == "assistant"), {})
    return {
        "id": ident, "shard": 0,
        "messages": [{"reasoning_content": None, **m} for m in messages],
        "content": answer.get("content", last.get("content")),
        "reasoning_content": answer.get("reasoning_content", last.get("reasoning_content")),
        "finish_reason": turns[-1]["finish_reason"] if turns else "stop",
        "prompt_tokens": 1, "completion_tokens": 1, "reasoning_tokens": 0, "model": "m",
        "server": "s", "attempts": 1, "latency_s": 0.1, "error": None, "turns": turns,
    }  # fmt: skip


def _frame(*rows: dict) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=row_schema())


def _tokens(template: ChatTemplate, ids: list[int]) -> list[str]:
    return [template.token_text(i) for i in ids]


def _split(template: ChatTemplate, sample: dict) -> tuple[list[str], list[str]]:
    """(prompt tokens, trained tokens) of one sample."""
    pairs = list(zip(_tokens(template, sample["input_ids"]), sample["loss_mask"], strict=True))
    assert [m for _, m in pairs] == sorted(m for _, m in pairs), "mask is prompt 0s then 1s"
    return [t for t, m in pairs if m == 0], [t for t, m in pairs if m == 1]


def test_single_turn_trains_from_think_through_im_end(qwen3: ChatTemplate) -> None:
    """Qwen3 thinking on: the prompt ends at `<|im_start|>assistant\\n`; the response is what
    the model generated, <think> through <|im_end|>, and not the "\\n" the template adds."""
    row = _row(
        "a",
        [{"role": "system", "content": "so"}, {"role": "user", "content": "Hi"}],
        [],
        content="\n\nBecause.",  # SGLang's qwen3 parser leaves the newlines in
        reasoning_content="hmm ok\n",
    )
    [sample] = samples(_frame(row), template=qwen3).collect().to_dicts()
    prompt, trained = _split(qwen3, sample)
    assert prompt == ["<|im_start|>", "system", "\n", "so", "<|im_end|>", "\n",
                      "<|im_start|>", "user", "\n", "Hi", "<|im_end|>", "\n",
                      "<|im_start|>", "assistant", "\n"]  # fmt: skip
    assert trained == [
        "<think>",
        "\n",
        "hmm",
        "ok",
        "\n",
        "</think>",
        "\n\n",
        "Because.",
        "<|im_end|>",
    ]
    assert sample["seq_len"] == len(prompt) + len(trained)
    assert sample["loss_tokens"] == len(trained) == 9
    assert (sample["id"], sample["turn"]) == ("a", 1)


def test_multi_turn_each_drops_earlier_reasoning_from_later_prompts(qwen3: ChatTemplate) -> None:
    """turns: all: one sample per answer; a later prompt carries the earlier answers without
    their reasoning (the Qwen3 template drops it, and the client never sends it)."""
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "hmm"},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "ok so"},
        {"role": "user", "content": "More?"},
        {"role": "assistant", "content": "done.", "reasoning_content": "so"},
    ]
    row = _row("c", messages, [_turn(1), _turn(2), _turn(3)])
    each = samples(_frame(row), "each", qwen3).collect().to_dicts()
    assert [s["turn"] for s in each] == [1, 2, 3]
    second_prompt, second = _split(qwen3, each[1])
    assert second == ["<think>", "\n", "ok", "so", "\n", "</think>", "\n\n", "Sure.", "<|im_end|>"]
    assert "<think>" not in second_prompt and "hmm" not in second_prompt
    assert second_prompt == ["<|im_start|>", "user", "\n", "Hi", "<|im_end|>", "\n",
                             "<|im_start|>", "assistant", "\n", "Because.", "<|im_end|>", "\n",
                             "<|im_start|>", "user", "\n", "Why?", "<|im_end|>", "\n",
                             "<|im_start|>", "assistant", "\n"]  # fmt: skip
    third_prompt, third = _split(qwen3, each[2])
    assert "Because." in third_prompt and "Sure." in third_prompt
    assert "<think>" not in third_prompt
    assert third == ["<think>", "\n", "so", "\n", "</think>", "\n\n", "done.", "<|im_end|>"]
    [last] = samples(_frame(row), "last", qwen3).collect().to_dicts()
    assert last == each[2]


def test_thinking_off_prompt_holds_the_empty_think_block(qwen3: ChatTemplate) -> None:
    """enable_thinking false: the server's prompt already holds `<think>\\n\\n</think>\\n\\n`,
    so the model generated only the answer: the empty think block is never trained on."""
    row = _row(
        "off", [{"role": "user", "content": "Hi"}], [], content="Sure.", reasoning_content=None
    )
    [sample] = samples(_frame(row), template=qwen3, enable_thinking=False).collect().to_dicts()
    prompt, trained = _split(qwen3, sample)
    assert prompt[-4:] == ["<think>", "\n\n", "</think>", "\n\n"]
    assert trained == ["Sure.", "<|im_end|>"]


def test_a_row_drawn_to_thinking_off_renders_its_own_prompt(qwen3: ChatTemplate) -> None:
    """regeneration.thinking_mix: the run thinks, this row was sent enable_thinking false
    (its `sampling` record), so its prompt is rendered with the empty think block."""
    off = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "enable_thinking": False}
    row = _row(
        "off", [{"role": "user", "content": "Hi"}], [], content="Sure.", reasoning_content=None
    )
    [sample] = samples(_frame({**row, "sampling": off}), template=qwen3).collect().to_dicts()
    prompt, trained = _split(qwen3, sample)
    assert prompt[-4:] == ["<think>", "\n\n", "</think>", "\n\n"]
    assert trained == ["Sure.", "<|im_end|>"]


def test_cut_off_turn_has_no_stop_token(qwen3: ChatTemplate) -> None:
    row = _row("cut", [{"role": "user", "content": "Hi"}], [_turn(1, "length")],
               content="Because.", reasoning_content="hmm")  # fmt: skip
    [sample] = samples(_frame(row), template=qwen3).collect().to_dicts()
    _, trained = _split(qwen3, sample)
    assert trained[-1] == "Because." and "<|im_end|>" not in trained


def test_stored_ids_win_and_rows_keep_their_order(qwen3: ChatTemplate) -> None:
    """Per turn: stored ids where both exist, the template otherwise, none without either."""
    user = [{"role": "user", "content": "Hi"}]
    with_ids = _row("ids", user, [_turn(1, ids=([7, 8], [9]))], content="Sure.")
    without = _row("tpl", user, [_turn(1)], content="Sure.")
    rows = _frame(without, with_ids, without | {"id": "tpl2"})
    out = samples(rows, template=qwen3).collect()
    assert out["id"].to_list() == ["tpl", "ids", "tpl2"]
    assert out.row(1, named=True)["input_ids"] == [7, 8, 9]
    assert out.row(1, named=True)["loss_mask"] == [0, 0, 1]
    assert samples(rows).collect()["id"].to_list() == ["ids"]  # no template: ids only
    assert out.columns == ["id", "turn", "input_ids", "loss_mask", "seq_len", "loss_tokens"]
    assert out.schema["input_ids"] == pl.List(pl.Int32)
    assert out.schema["loss_mask"] == pl.List(pl.Int8)


def test_error_row_keeps_the_turns_that_succeeded(qwen3: ChatTemplate) -> None:
    """turns: all, turn 3 failed: `messages` ends at its user message; turns 1 and 2 are
    samples, each prompt the history before it."""
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "hmm"},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "ok"},
        {"role": "user", "content": "More?"},
    ]
    row = _row("e", messages, [_turn(1), _turn(2)]) | {"error": "turn 3: http 400"}
    out = samples(_frame(row), "each", qwen3).collect().to_dicts()
    assert [s["turn"] for s in out] == [1, 2]
    assert _split(qwen3, out[1])[1][-2:] == ["Sure.", "<|im_end|>"]
    assert "More?" not in _split(qwen3, out[1])[0]


def test_error_rows_give_samples_only_for_answered_turns(qwen3: ChatTemplate) -> None:
    failed = _row("e", [{"role": "user", "content": "Hi"}], []) | {
        "error": "http 500",
        "content": None,
    }
    assert samples(_frame(failed), template=qwen3).collect().height == 0


def test_template_is_rendered_as_transformers_does(tmp_path: Path) -> None:
    """`{% generation %}` compiles, tojson keeps `<`, raise_exception is a clear error,
    chat_template.jinja wins over tokenizer_config.json, and bos_token is a variable."""
    model = qwen3_model_dir(tmp_path / "m", WORDS)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["bos_token"] = {"content": "<|endoftext|>", "__type": "AddedToken"}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('no system role') }}{% endif %}"
        "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
        "{% else %}{{ {'q': m.content} | tojson }}{% endif %}{% endfor %}"
    )
    template, _ = load_template(model)
    assert template is not None and template.path.name == "chat_template.jinja"
    text = template.render([{"role": "user", "content": "<b>"}], add_generation_prompt=True)
    assert text == '<|endoftext|>{"q": "<b>"}'
    with pytest.raises(UserError, match="no system role"):
        template.render([{"role": "system", "content": "x"}], add_generation_prompt=False)


def test_model_dir_without_template_or_tokenizer(tmp_path: Path) -> None:
    model = qwen3_model_dir(tmp_path / "m")
    (model / "tokenizer_config.json").unlink()
    template, why = load_template(model)
    assert template is None and "no chat template" in why
    with pytest.raises(UserError, match=r"tokenizer\.json not found"):
        load_template(tmp_path / "nothing")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if %}"}))
    with pytest.raises(UserError, match="does not compile"):
        load_template(model)


def test_parity_finds_the_first_differing_token(qwen3: ChatTemplate, tmp_path: Path) -> None:
    """Prompts stored by a server with another template (a default system prompt) differ
    from the model directory's rendering at the first token; the same template's do not."""
    other_dir = qwen3_model_dir(tmp_path / "other", WORDS)
    other_source = (
        "{% if messages[0].role != 'system' %}<|im_start|>system\nso<|im_end|>\n{% endif %}"
    )
    config = json.loads((other_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = other_source + QWEN3_TEMPLATE
    (other_dir / "tokenizer_config.json").write_text(json.dumps(config))
    other, _ = load_template(other_dir)
    assert other is not None
    row = _row("p", [{"role": "user", "content": "Hi"}], [_turn(1)], content="Sure.")
    [turn] = turn_inputs(row)
    for server, expected in ((qwen3, 0), (other, 1)):
        prompt = server.encode([server.render(turn.prompt, add_generation_prompt=True,
                                              enable_thinking=True)])[0]  # fmt: skip
        stored = turn_inputs(row | {"turns": [_turn(1, ids=(prompt, [3]))]})
        diffs = prompt_differences(qwen3, stored, enable_thinking=True)
        assert len(diffs) == expected
    [d] = diffs
    assert (d.id, d.turn, d.position) == ("p", 1, 1)
    assert qwen3.token_text(d.stored or 0) == "system"
    assert qwen3.token_text(d.rendered or 0) == "user"
