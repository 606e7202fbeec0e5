"""Both loss-mask paths agree on what a server returns: a real emulator answers through the
dispatcher, storing its token ids; the template path, given the same rows without ids and
the emulator's model directory, rebuilds the very same input_ids and loss_mask."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from regen.audit import run_audit
from regen.config import AuditConfig, Turns
from regen.dataset import commit_shard
from regen.lossmask import load_template, samples
from regen.sglang_api.endpoint import Endpoint
from regen.storage import LocalStorage
from regen.tools import template_tools
from support.emulator import MODEL_DIR
from tests.test_conversations import conversations, endpoint, regenerate

__all__ = ["endpoint"]  # the module-scoped emulator fixture, shared with its own tests

pytestmark = pytest.mark.timeout(120)


def _without_ids(rows: pl.DataFrame) -> pl.DataFrame:
    """The rows as an older dataset, or a server without return_token_ids, stores them."""
    none = pl.lit(None, pl.List(pl.Int32))
    cleared = pl.element().struct.with_fields(prompt_token_ids=none, response_token_ids=none)
    return rows.with_columns(pl.col("turns").list.eval(cleared))


@pytest.mark.parametrize("turns", ["all", "last"])
def test_template_path_equals_ids_path(endpoint: Endpoint, turns: str) -> None:
    out = regenerate(endpoint, conversations(4), turns=turns)
    assert out["error"].null_count() == out.height
    template, why = load_template(MODEL_DIR)
    assert template is not None, why
    choices: list[Turns] = ["each", "last"]
    for each in choices:
        from_ids = samples(out, each).collect()
        assert from_ids.height == (12 if turns == "all" and each == "each" else 4)
        rebuilt = samples(_without_ids(out), each, template).collect()
        assert_frame_equal(rebuilt, from_ids)
        # Stored ids win: the template is not asked where they exist.
        assert_frame_equal(samples(out, each, template).collect(), from_ids)


def test_thinking_off_prompt_is_the_servers(endpoint: Endpoint) -> None:
    """enable_thinking false: the template path's prompt, empty think block included, is the
    server's stored prompt to the token; the answer after it is what is trained on."""
    out = regenerate(endpoint, conversations(4), turns="all", thinking="off")
    template, why = load_template(MODEL_DIR)
    assert template is not None, why
    # The client stores no response ids when thinking is not saved: the template fills them.
    rebuilt = samples(out, "each", template, enable_thinking=False).collect()
    stored = out.select(pl.col("turns").explode().struct.field("prompt_token_ids")).to_series()
    assert rebuilt.height == stored.len() == 12
    for sample, prompt in zip(rebuilt.iter_rows(named=True), stored.to_list(), strict=True):
        n = len(prompt)
        assert sample["input_ids"][:n] == prompt
        assert sample["loss_mask"] == [0] * n + [1] * (sample["seq_len"] - n)
        assert template.token_text(sample["input_ids"][-1]) == "<|im_end|>"


def test_planted_template_mismatch_fails_parity(endpoint: Endpoint, tmp_path: Path) -> None:
    """The emulator serves its model directory's template; the audit is given a copy whose
    template opens <think> in the generation prompt (as newer Qwen templates do): every
    stored prompt differs at its end. The directory the server used passes."""
    out = regenerate(endpoint, conversations(6), turns="all")
    storage = LocalStorage(tmp_path / "ds")
    commit_shard(storage, 3, out, fingerprint="f", timings={})
    run = {"fingerprint": "f", "regeneration": {"thinking": "save", "turns": "all"}}
    storage.write_bytes("run.json", json.dumps(run).encode())
    other = tmp_path / "other-model"
    shutil.copytree(MODEL_DIR, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    served = "{{- '<|im_start|>assistant\\n' }}\n{%- if enable_thinking"
    assert served in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(
        served, "{{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- if enable_thinking"
    )
    (other / "tokenizer_config.json").write_text(json.dumps(config))

    mismatch = run_audit(storage, AuditConfig(), tokenizer_path=other)
    parity = mismatch.check("template_parity")
    assert parity.status == "fail" and parity.figure == 1.0
    assert parity.detail.startswith("18 of 18 stored prompts differ")
    stored = out["turns"].list.first().struct.field("prompt_token_ids").list.len()[0]
    assert parity.examples[0].id == "c-0#t1"
    assert parity.examples[0].reason.startswith(
        f"first difference at token {stored} (stored {stored}, template {stored + 2} tokens): "
        "stored end of prompt, template id "
    )
    assert mismatch.verdict == "fail"
    # The loss-mask check does not need the template: every turn has the server's ids.
    assert "from stored token ids: 18, from the chat template: 0" in (
        mismatch.check("loss_mask").detail
    )
    same = run_audit(storage, AuditConfig(), tokenizer_path=MODEL_DIR).check("template_parity")
    assert same.status == "pass" and same.figure == 0.0
    assert same.detail.startswith("0 of 18 stored prompts differ")


# transformers' extras, each used: strftime_now, {% generation %}, tools, a special token.
_EXTRAS_TEMPLATE = """\
{%- if tools is not none %}<|im_start|>system
tools {{ tools | tojson }} today {{ strftime_now('%Y') }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_start|>assistant
{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}{{ eos_token }}
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if reasoning_effort is defined %}effort {{ reasoning_effort }}
{% endif %}{% endif %}"""


def test_emulator_and_audit_render_one_template_alike(tmp_path: Path) -> None:
    """One renderer: a template using strftime_now, {% generation %}, tools and eos_token is
    served by the emulator and rendered by the audit's template parity check to the same
    prompt ids."""
    import httpx

    from regen.lossmask.conversation import TurnInput
    from regen.lossmask.parity import prompt_differences
    from support.emulator import Emulator

    model = tmp_path / "model"
    shutil.copytree(MODEL_DIR, model)
    (model / "chat_template.jinja").write_text(_EXTRAS_TEMPLATE)
    template, why = load_template(model)
    assert template is not None, why
    messages = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "the answer"},
        {"role": "user", "content": "and again"},
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    # Only the prompt ids are compared: no simulated load, and answers at 100x speed (the
    # default pace is seconds of reasoning tokens a request, for nothing this test reads).
    emu = Emulator.launch(
        tmp_path, "--emu-load-s", "0", "--emu-time-scale", "0.01", model_dir=model
    )
    try:
        emu.wait_ready()

        def prompt_ids(**extra: object) -> list[int]:
            body = {"model": "emu-model", "messages": messages, "return_token_ids": True}
            answer = httpx.post(f"{emu.url}/v1/chat/completions", json=body | extra, timeout=30)
            assert answer.status_code == 200, answer.text
            return list(answer.json()["choices"][0]["prompt_token_ids"])

        plain = prompt_ids(reasoning_effort="high")
        with_tools = prompt_ids(tools=tools, chat_template_kwargs={"enable_thinking": True})
        ignored = prompt_ids(tools=tools, tool_choice="none")
    finally:
        emu.stop()
    # What the audit's template parity runs on a stored turn: no difference.
    turn = TurnInput("r", 2, messages, {}, "stop", "high", plain, None)
    assert prompt_differences(template, [turn], enable_thinking=True) == []
    assert template.encode([template.render(messages, add_generation_prompt=True)]) == [ignored]
    # SGLang hands the template each tool's Tool.model_dump() (an unset description as null,
    # the tool's defer_loading): regen.tools.template_tools, judged in tests/contract.
    dumped = template_tools(tools)
    assert dumped == [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {}, "description": None},
            "defer_loading": None,
        }
    ]
    text = template.render(messages, add_generation_prompt=True, tools=dumped)
    assert '"name": "lookup"' in text and "today 2" in text
    assert template.encode([text]) == [with_tools]
    assert plain != ignored != with_tools
