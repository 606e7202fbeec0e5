"""The loss-mask and template-parity checks on datasets whose turns store the server's token
ids (as a server with `return_token_ids` writes them), beside the template path for turns that
store none."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from regen.audit import run_audit
from regen.config import AuditConfig
from regen.dataset import commit_shard
from regen.lossmask import ChatTemplate, load_template
from regen.schema import row_schema
from regen.storage import LocalStorage
from tests.support.lossmask import QWEN3_TEMPLATE, qwen3_model_dir, write_chat_template

WORDS = ["Hi", "OK.", "The", "answer", "is", "42.", "Let", "me", "think."]
ANSWER = "The answer is 42. " * 6
SYSTEM_DEFAULT = (
    "{% if messages[0].role != 'system' %}<|im_start|>system\nLet me<|im_end|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen3_model_dir(tmp_path_factory.mktemp("model"), WORDS)


def _server(model_dir: Path) -> ChatTemplate:
    template, why = load_template(model_dir)
    assert template is not None, why
    return template


def _dataset(
    root: Path, server: ChatTemplate, rows: int, incident: float = 0.0, ids: float = 1.0
) -> tuple[LocalStorage, set[str]]:
    """`rows` one-turn rows rendered by `server`; the first `incident` share answer
    `<think>\\n\\n</think>\\n\\nOK.<|im_end|>` (6 tokens), the first `ids` share store ids."""
    storage = LocalStorage(root)
    out, hit = [], set()
    for i in range(rows):
        ident = f"r{i:04d}"
        bad = i < round(incident * rows)
        content, reasoning = ("OK.", "") if bad else (ANSWER, "Let me think.")
        prompt = [{"role": "user", "content": f"Hi {i}"}]
        text = server.render(prompt, add_generation_prompt=True, enable_thinking=True)
        answer = f"<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>".replace("\n\n\n", "\n\n")
        p_ids, r_ids = server.encode([text, answer])
        keep = i < round(ids * rows)
        if bad:
            hit.add(ident)
            assert len(r_ids) == 6
        turn = {
            "turn": 1, "finish_reason": "stop", "prompt_tokens": len(p_ids),
            "completion_tokens": len(r_ids), "reasoning_tokens": 3, "reasoning_effort": None,
            "server": "server-0", "attempts": 1, "latency_s": 0.1,
            "prompt_token_ids": p_ids if keep else None,
            "response_token_ids": r_ids if keep else None,
        }  # fmt: skip
        out.append(
            {
                "id": ident, "shard": 0,
                "messages": [{**prompt[0], "reasoning_content": None}],
                "content": content, "reasoning_content": reasoning or None,
                "finish_reason": "stop", "prompt_tokens": len(p_ids),
                "completion_tokens": len(r_ids), "reasoning_tokens": 3, "model": "m",
                "server": "server-0", "attempts": 1, "latency_s": 0.1, "error": None,
                "turns": [turn],
            }
        )  # fmt: skip
    frame = pl.DataFrame(out, schema=row_schema())
    commit_shard(storage, 0, frame, fingerprint="f", timings={})
    run = {"fingerprint": "f", "regeneration": {"thinking": "save"}}
    storage.write_bytes("run.json", json.dumps(run).encode())
    return storage, hit


def test_incident_fails_the_loss_mask_from_ids_alone(tmp_path: Path, model: Path) -> None:
    """87 % of answers are the incident's: the loss-mask check fails on the stored ids, no
    tokenizer."""
    storage, hit = _dataset(tmp_path, _server(model), 200, incident=0.87)
    result = run_audit(storage, AuditConfig())
    check = result.check("loss_mask")
    assert check.status == "fail"
    assert check.figure == pytest.approx(0.87, abs=1e-9)
    assert {e.reason for e in check.examples} == {"6 loss tokens"}
    assert {e.id for e in check.examples} <= hit
    assert "from stored token ids: 200, from the chat template: 0" in check.detail
    assert "without token ids" not in check.detail
    assert result.lengths["loss_tokens"].p1 == 6
    assert result.check("template_parity").status == "skipped"  # no template to compare


def test_turns_without_ids_use_the_template_and_say_so(tmp_path: Path, model: Path) -> None:
    """A server that returned ids for only some turns: the rest come from the template, and
    the check says how many; both paths count the incident's answer as 6 tokens."""
    storage, hit = _dataset(tmp_path, _server(model), 100, incident=0.5, ids=0.3)
    audited = run_audit(storage, AuditConfig(), tokenizer_path=model)
    with_template = audited.check("loss_mask")
    assert with_template.figure == pytest.approx(0.5)
    assert {e.id for e in with_template.examples} <= hit
    assert "from stored token ids: 30, from the chat template: 70" in with_template.detail
    assert "70 answers without token ids" in with_template.detail
    parity = audited.check("template_parity")
    assert parity.status == "pass"
    assert parity.detail.endswith(
        "(30 rows of 1 of 1 shards checked; 70 rows there store no prompt ids)"
    )
    ids_only = run_audit(storage, AuditConfig()).check("loss_mask")
    assert ids_only.figure == 1.0  # the 30 rows with ids are all incident rows
    assert "from stored token ids: 30, from the chat template: 0" in ids_only.detail
    assert "70 not measured (no tokenizer or chat template given" in ids_only.detail


def test_planted_template_mismatch_fails_parity(tmp_path: Path, model: Path) -> None:
    """The server rendered a default system prompt that the model directory's template
    lacks: every stored prompt differs at token 1, and a trainer would see other tokens."""
    served = write_chat_template(
        qwen3_model_dir(tmp_path / "served", WORDS), SYSTEM_DEFAULT + QWEN3_TEMPLATE
    )
    storage, _ = _dataset(tmp_path / "ds", _server(served), 50)
    check = run_audit(storage, AuditConfig(), tokenizer_path=model).check("template_parity")
    assert check.status == "fail"
    assert check.figure == 1.0
    assert "50 of 50 stored prompts differ from the template in tokenizer_config.json" in (
        check.detail
    )
    assert len(check.examples) == 5
    tok = _server(model).tokenizer.token_to_id
    assert check.examples[0].reason == (
        "first difference at token 1 (stored 17, template 10 tokens): "
        f"stored id {tok('system')}, template id {tok('user')}"
    )
    same = run_audit(storage, AuditConfig(), tokenizer_path=served).check("template_parity")
    assert same.status == "pass" and same.figure == 0.0


def test_parity_checks_an_even_sample(tmp_path: Path, model: Path) -> None:
    storage, _ = _dataset(tmp_path, _server(model), 100)
    config = AuditConfig(template_parity_rows=10)
    check = run_audit(storage, config, tokenizer_path=model).check("template_parity")
    assert check.status == "pass"
    assert "0 of 10 stored prompts differ" in check.detail
    assert "(10 rows of 1 of 1 shards checked)" in check.detail


def test_cli_audit_takes_the_model_directory(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`regen audit DATASET --tokenizer MODEL_DIR`: the mismatch fails the gate (exit 1)."""
    from flows.cli import main

    monkeypatch.setenv("COLUMNS", "300")  # the table on one line per check

    served = write_chat_template(
        qwen3_model_dir(tmp_path / "served", WORDS), SYSTEM_DEFAULT + QWEN3_TEMPLATE
    )
    storage, _ = _dataset(tmp_path / "ds", _server(served), 20)
    assert main(["audit", str(storage.root), "--tokenizer", str(model)]) == 1
    out = capsys.readouterr().out
    parity = next(line for line in out.splitlines() if "│ template parity " in line)
    assert "│ fail " in parity and "20 of 20 stored prompts differ" in parity
    assert out.rstrip().endswith("verdict: fail")
    # A --tokenizer that names nothing is a usage error (2), never a failed audit's 1.
    with pytest.raises(SystemExit) as exited:
        main(["audit", str(storage.root), "--tokenizer", str(tmp_path / "none")])
    assert exited.value.code == 2
    assert "none: no such file or directory" in capsys.readouterr().err
