"""`regen rehearse --engine sglang`, as a user runs it: the real SGLang server on this CPU serving
a tiny twin of the configured model, with its tokenizer, chat template, reasoning parser and
launch flags, through the whole flow. Two models: the bundled one (its twin is the engine tests'
tiny model) and a Hub-style directory (a byte-level BPE tokenizer numbered as Qwen's are, the
big model's config.json and weight index, no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import yaml

from regen.dataset import read_committed
from regen.rehearsal import bundled
from regen.storage import LocalStorage
from support.engine import HANG_GUARD_S, SGLANG_PYTHON
from tests.support.cli import run_regen


def _node(tmp: Path, model: str, served: str, **engine: object) -> Path:
    config = {
        "model": {"source": model, "served_name": served},
        "prompts": str(bundled("sample_prompts.jsonl")),
        "output": "s3://datasets/never-written",
        "work_dir": str(tmp / "work"),
        "engine": {
            "gpus": list(range(7)),
            "python": "/opt/node/bin/python",
            "context_length": 8192,
            **engine,
        },
        "sampling": {"max_tokens": 4096},
    }
    path = tmp / "node.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _rehearse(tmp: Path, node: Path, env: dict[str, str], *args: str) -> tuple[str, Path]:
    cmd = ["rehearse", "--config", str(node), "--engine", "sglang",
           "--engine-python", str(SGLANG_PYTHON), *args]  # fmt: skip
    done = run_regen(cmd, env, tmp, HANG_GUARD_S)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    output = tmp / "work" / "rehearsal" / "datasets-never-written-sglang"
    assert f"rehearsal: writing to {output}" in out
    return out, output


def test_a_dress_rehearsal_of_the_bundled_model(tmp_path: Path, regen_env: dict[str, str]) -> None:
    node = _node(tmp_path, str(bundled("emulator-model")), "qwen3.6-27b",
                 extra_args=["--cuda-graph-max-bs-decode", "16"])  # fmt: skip
    out, output = _rehearse(tmp_path, node, regen_env, "--sample", "40")
    assert "the text is random: not judged here: empty_answer" in out
    assert "GPU-only launch flags dropped: --cuda-graph-max-bs-decode 16" in out
    assert "audit: pass" in out
    rows = read_committed(LocalStorage(output)).scan().collect()
    assert rows.height == 40 and rows["error"].null_count() == 40
    # The real qwen3 parser split the planted answer on </think>.
    assert (rows["finish_reason"] == "stop").all()
    assert rows["reasoning_content"].str.contains("let me check").all()
    assert rows["content"].str.contains("answer is ten").all()
    log = next((tmp_path / "work").glob("runs/*/logs/server-0.log")).read_text()
    assert "reasoning_parser=qwen3" in log  # the config's parser, in the real server


def _hub_style_model(root: Path) -> Path:
    """A model directory as `hf download` leaves it, less the weights: a byte-level BPE whose
    special tokens come after its vocabulary (as Qwen's), a thinking chat template, the model's
    own config.json and weight index."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    texts = [json.loads(line)["messages"][0]["content"]
             for line in bundled("sample_prompts.jsonl").read_text().splitlines()]  # fmt: skip
    texts += ["let me check the first step then sum", "answer is ten.", "system user assistant"]
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tokenizer.add_tokens(["<think>", "</think>"])
    root.mkdir(parents=True)
    tokenizer.save(str(root / "tokenizer.json"))
    bundled_config = json.loads((bundled("emulator-model") / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": bundled_config["chat_template"],
    }))  # fmt: skip
    (root / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "hidden_size": 5120, "num_hidden_layers": 64, "vocab_size": 248320,
    }))  # fmt: skip
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    return root


def test_a_dress_rehearsal_of_a_hub_style_model(tmp_path: Path, regen_env: dict[str, str]) -> None:
    model = _hub_style_model(tmp_path / "hf" / "Qwen3.6-27B")
    node = _node(tmp_path, str(model), "qwen3.6-27b")
    out, output = _rehearse(tmp_path, node, regen_env, "--sample", "24", "--servers", "1")
    assert "serves a tiny twin of" in out and "audit: pass" in out
    twin = tmp_path / "work" / "rehearsal" / "twin" / "qwen3.6-27b"
    assert (twin / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    assert json.loads((twin / "config.json").read_text())["model_type"] == "qwen3"
    rows = read_committed(LocalStorage(output)).scan().collect()
    assert rows.height == 24 and rows["error"].null_count() == 24
    turns = rows.select(pl.col("turns").list.first().struct.unnest())
    assert (turns["response_token_ids"].list.len() == turns["completion_tokens"]).all()
    audit = json.loads((output / "report" / "audit.json").read_text())
    parity = next(c for c in audit["checks"] if c["name"] == "template_parity")
    assert parity["status"] == "pass" and parity["figure"] == 0, parity

