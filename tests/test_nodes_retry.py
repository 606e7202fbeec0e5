"""A multi-node run refuses `generation.retry_errors` before any node starts.

Its children claim only shards without a manifest (`regen.multinode.balance.ShardPicker`), so the
flag would be silently ignored; the error rows are retried by a single-node run instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from regen.config import parse_config
from regen.errors import ConfigError
from regen.multinode.nodes import NodeConfig, check_nodes
from regen.rehearsal import bundled


def _run(tmp_path: Path, **generation: Any) -> Any:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    data: dict[str, Any] = {
        "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp_path / "out"),
        "engine": {"kind": "emulator", "gpus": [0], "base_port": 31000},
        "generation": generation,
    }
    return parse_config(data, "test")


def test_check_nodes_refuses_retry_errors_and_says_what_to_do(tmp_path: Path) -> None:
    nodes = [NodeConfig(name="node-1"), NodeConfig(name="node-2", engine={"gpus": [0, 1]})]
    with pytest.raises(ConfigError) as err:
        check_nodes(_run(tmp_path, retry_errors=True), nodes)
    message = str(err.value)
    assert message.startswith("generation.retry_errors: not supported by a multi-node run")
    assert "single-node run" in message and "same output" in message


def test_check_nodes_accepts_the_run_without_retry_errors(tmp_path: Path) -> None:
    nodes = [NodeConfig(name="node-1"), NodeConfig(name="node-2", engine={"gpus": [0, 1]})]
    configs = check_nodes(_run(tmp_path, retry_errors=False), nodes)
    assert set(configs) == {"node-1", "node-2"}
    assert not any(c.generation.retry_errors for c in configs.values())
