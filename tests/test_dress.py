"""A dress rehearsal's config: the user's, less what needs a GPU (each dropped thing listed),
on the real engine on the CPU, over a twin of the model; its quality checks not judged."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from regen.errors import ConfigError
from regen.rehearsal import bundled, plan_rehearsal
from regen.rehearsal.dress import NOT_JUDGED, split_gpu_flags
from regen.rehearsal.twin import build_twin


def test_gpu_only_flags_go_with_their_values() -> None:
    args = ["--cuda-graph-max-bs-decode", "16", "--tool-call-parser", "qwen25",
            "--kv-cache-dtype=fp8_e4m3", "--tp-size", "2", "--enable-metrics-for-all-schedulers",
            "--speculative-num-steps", "3"]  # fmt: skip
    kept, dropped = split_gpu_flags(args)
    assert kept == ["--tool-call-parser", "qwen25", "--enable-metrics-for-all-schedulers"]
    assert dropped == ["--cuda-graph-max-bs-decode", "16", "--kv-cache-dtype=fp8_e4m3",
                       "--tp-size", "2", "--speculative-num-steps", "3"]  # fmt: skip


def _node(tmp_path: Path, **engine: object) -> Path:
    config = {
        "model": {"source": str(bundled("emulator-model")), "served_name": "qwen3.6-27b"},
        "prompts": str(bundled("sample_prompts.jsonl")),
        "output": "s3://datasets/qwen",
        "work_dir": str(tmp_path / "work"),
        "engine": {"gpus": [0, 1, 2, 3, 4, 5, 6], "python": "/opt/venv/bin/python", **engine},
        "sampling": {"max_tokens": 4096},
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_dress_config_runs_the_real_engine_on_the_cpu(tmp_path: Path) -> None:
    path = _node(tmp_path, extra_args=["--cuda-graph-max-bs-decode", "16"])
    rehearsal = plan_rehearsal(config_path=path, engine_kind="sglang",
                               engine_python="/x/bin/python", sample=20)  # fmt: skip
    config, plan = rehearsal.config, rehearsal.dress
    assert plan is not None and rehearsal.source is not None
    engine = config.engine
    assert (engine.kind, engine.device, engine.servers, engine.python) == (
        "sglang", "cpu", 2, "/x/bin/python"
    )
    assert engine.extra_args == [] and not engine.speculative.enabled
    assert engine.reasoning_parser == rehearsal.source.engine.reasoning_parser
    assert config.model.source == str(plan.twin_dir) and config.prompts == str(plan.sample)
    assert config.model.served_name == "qwen3.6-27b"
    assert config.sampling.max_tokens == 64 and set(config.audit.not_judged) == set(NOT_JUDGED)
    # Its own dataset: never the GPU run's, never an emulator rehearsal's.
    assert config.output == str(tmp_path / "work" / "rehearsal" / "datasets-qwen-sglang")
    notice = "\n".join(plan.notice())
    assert "the text is random" in notice and "--cuda-graph-max-bs-decode 16" in notice
    assert "speculative decoding off" in notice and "4096 -> 64" in notice


def test_emulator_only_flags_are_refused_with_the_real_engine(tmp_path: Path) -> None:
    from flows.cli import main

    path = _node(tmp_path)
    assert main(["rehearse", "--config", str(path), "--engine", "sglang",
                 "--emu-fault", "empty-answer=0.5"]) == 2  # fmt: skip
    with pytest.raises(SystemExit):
        main(["rehearse", "--engine", "vllm"])
    assert main(["rehearse", "--sample", "5"]) == ConfigError.exit_code


def test_the_twin_keeps_the_tokenizer_and_plants_a_reasoning_answer(tmp_path: Path) -> None:
    twin = build_twin(bundled("emulator-model"), tmp_path / "twin", context_length=2048)
    names = sorted(p.name for p in twin.path.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (twin.path / name).read_bytes() == (bundled("emulator-model") / name).read_bytes()
    # The bundled tokenizer: 86 tokens, then the tool-call tags and JSON pieces.
    assert twin.vocab_size == 102 and twin.planted[0] == 1 and twin.planted[-1] == 82
    assert 83 in twin.planted and 84 in twin.planted  # <think>, </think>
    # Byte-identical on every build: a twin is a fixture, not a draw.
    again = build_twin(bundled("emulator-model"), tmp_path / "again", context_length=2048)
    assert (again.path / "model.safetensors").read_bytes() == (
        twin.path / "model.safetensors"
    ).read_bytes()
