"""`regeneration.thinking`: what is sent and what is stored, decided by the dispatcher (checked
here for every mode against emulators served in this process), and one whole flow for what
the run records and what the audit makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from regen.audit import run_audit
from regen.client import Dispatcher
from regen.config import AuditConfig, GenerationConfig, RegenerationConfig, SamplingConfig
from regen.dataset import read_committed
from regen.rehearsal import rehearsal_config
from regen.sglang_api.endpoint import Endpoint
from regen.storage import open_storage
from support.emulator import in_process
from tests.test_dispatcher import prompts

MODEL = "emu-model"


@pytest.mark.parametrize("thinking", ["save", "drop", "off"])
def test_thinking_mode_decides_what_is_sent_and_stored(thinking: str) -> None:
    flags = [
        "--reasoning-parser", "qwen3", "--emu-load-s", "0", "--emu-time-scale", "0.01",
        "--emu-reasoning-tokens", "5:20", "--emu-answer-tokens", "5:20",
    ]  # fmt: skip
    rows = prompts(12)
    with (
        in_process([flags], served_name=MODEL) as fleet,
        Dispatcher(
            [Endpoint(0, fleet[0].url)],
            api_key=SecretStr("unused"),
            model=MODEL,
            sampling=SamplingConfig(max_tokens=256),
            generation=GenerationConfig(),
            concurrency_per_server=4,
            regeneration=RegenerationConfig(thinking=thinking),
        ) as dispatcher,
    ):
        out = dispatcher.submit_shard(0, rows).result(timeout=30)
    assert out["error"].null_count() == rows.height
    stored = out["reasoning_content"].drop_nulls().str.len_bytes().gt(0).sum()
    # The emulator thinks only when enable_thinking is true; off also spends no reasoning
    # tokens, drop spends them and keeps no text.
    assert stored == (rows.height if thinking == "save" else 0)
    assert (out["reasoning_tokens"] > 0).all() == (thinking != "off")
    assert (out["reasoning_tokens"] == 0).all() == (thinking == "off")


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("prefect_harness")
def test_dropped_thinking_through_the_flow(tmp_path: Path) -> None:
    """drop: thought but not stored; run.json records it and the audit skips its check."""
    from flows.regenerate import regenerate_completions

    path = tmp_path / "rehearsal.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "work_dir": str(tmp_path / "work"),
                "shard_size": 120,
                "regeneration": {"thinking": "drop"},
            }
        )
    )
    out = str(tmp_path / "out")
    config = rehearsal_config(config_path=path, out=out, servers=2)
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    storage = open_storage(out)
    assert json.loads(storage.read_bytes("run.json"))["regeneration"]["thinking"] == "drop"
    rows = read_committed(storage).collect()
    assert rows.height == 240 and rows["error"].null_count() == 240
    assert rows["reasoning_content"].drop_nulls().str.len_bytes().gt(0).sum() == 0
    assert int(rows["reasoning_tokens"].sum()) > 0
    assert run_audit(storage, AuditConfig()).check("empty_thinking").status == "skipped"
