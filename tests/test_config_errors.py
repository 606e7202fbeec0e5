"""A config mistake is one line naming the dotted key, exit 2, no traceback, no Prefect start."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.config import parse_config
from regen.errors import ConfigError
from tests.support.cli import run_regen

BASE = """
model: {source: /models/m, served_name: m}
prompts: p.jsonl
output: out
"""


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("engine: {gpus: [0], bogus: 1}", "engine.bogus: unknown key"),
        ("engine: {base_port: lots}", "engine.base_port: Input should be a valid integer"),
        ("shard_size: -5", "shard_size: Input should be greater than 0"),
        ("sampling: {max_tokens: 0}", "sampling.max_tokens"),
        ("engine: {base_port: 70000}", "engine.base_port"),
        ("engine: {gpus: [99]}", "engine.gpus.0"),
    ],
)
def test_config_error_names_dotted_key(tmp_path: Path, regen_env, extra: str, key: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(BASE + extra + "\n")
    proc = run_regen(["check", "--config", str(cfg)], regen_env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert key in lines[0] and "bad.yaml" in lines[0]


def test_invalid_yaml_names_line(tmp_path: Path, regen_env) -> None:
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("model: {source: x\nprompts: [\n")
    proc = run_regen(["check", "--config", str(cfg)], regen_env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "broken.yaml" in proc.stderr and "line" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_non_loopback_host_requires_key() -> None:
    data = {
        "model": {"source": "x", "served_name": "m"},
        "prompts": "p",
        "output": "o",
        "engine": {"host": "0.0.0.0"},
    }
    with pytest.raises(ConfigError, match=r"engine: .*0\.0\.0\.0.*api_key"):
        parse_config(data)


def test_s3_url_without_bucket() -> None:
    data = {"model": {"source": "x", "served_name": "m"}, "prompts": "s3:///p", "output": "o"}
    with pytest.raises(ConfigError, match=r"prompts: .*no bucket"):
        parse_config(data)
