"""`regeneration.thinking` through the whole flow on emulators: what is sent, what is stored,
and what the audit makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from regen.audit import AuditConfig, run_audit
from regen.dataset import read_committed
from regen.rehearsal import rehearsal_config
from regen.storage import open_storage

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("prefect_harness")]


@pytest.mark.parametrize("thinking", ["save", "drop", "off"])
def test_thinking_mode_decides_what_is_stored(tmp_path: Path, thinking: str) -> None:
    from flows.regenerate import regenerate_completions

    path = tmp_path / "rehearsal.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "work_dir": str(tmp_path / "work"),
                "shard_size": 120,
                "regeneration": {"thinking": thinking},
            }
        )
    )
    out = str(tmp_path / "out")
    config = rehearsal_config(config_path=path, out=out, servers=2)
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    storage = open_storage(out)
    assert json.loads(storage.read_bytes("run.json"))["regeneration"]["thinking"] == thinking
    rows = read_committed(storage).collect()
    assert rows.height == 240 and rows["error"].null_count() == 240
    stored = rows["reasoning_content"].drop_nulls().str.len_bytes().gt(0).sum()
    # The emulator thinks only when enable_thinking is true; off also spends no reasoning tokens.
    assert stored == (240 if thinking == "save" else 0)
    thought = int(rows["reasoning_tokens"].sum())
    assert (thought > 0) == (thinking != "off")
    check = run_audit(storage, AuditConfig()).check("empty_thinking")
    assert check.status == ("pass" if thinking == "save" else "skipped")
