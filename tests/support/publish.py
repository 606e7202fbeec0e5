"""A finished dataset as a run leaves one, for the publish tests: committed shards with the
server's token ids (tests/support/export.py), a run.json that names its model, sampling mix
and a Hub prompt source, the rejects file, and the real audit's report and plots."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from regen.audit import AuditResult, run_audit, write_report
from regen.config import AuditConfig
from regen.dataset import RUN_KEY
from regen.dataset.rejects import write_rejects
from regen.prompts import REJECTS_SCHEMA
from regen.storage import Storage
from support.hub import TOKEN, LoopbackHub
from tests.support.export import make_export_dataset
from tests.support.hub import hub_settings

# The synthetic answers are 1 to 119 tokens long, drawn at random: only the defect checks'
# token floors are lowered, so the audit passes and judges everything else as a run's would.
AUDIT = AuditConfig(min_answer_tokens=0, tiny_length_tokens=0, min_loss_tokens=0)
PROMPTS = "org/prompts"
PROMPTS_LICENSE = "apache-2.0"


def publishing_hub(monkeypatch: pytest.MonkeyPatch, hub: LoopbackHub, home: Path) -> None:
    """huggingface_hub in this process pointed at `hub` with `TOKEN` (write access), uploading
    through the LFS protocol the loopback Hub speaks: hf_xet's CAS protocol is not served
    here (`upload_folder` without it is LFS uploads and one commit)."""
    from huggingface_hub import constants

    hub_settings(monkeypatch, hub.endpoint, home)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    # The upload's progress bars read this copy of the setting, made at import (the
    # terminal's user sees them; a test's stderr holds the one line it judges).
    bars = importlib.import_module("huggingface_hub.utils.tqdm")
    monkeypatch.setattr(bars, "HF_HUB_DISABLE_PROGRESS_BARS", True)


def prompt_source(hub: LoopbackHub) -> dict[str, Any]:
    """A Hub prompt set whose card declares a license, as run.json records its source."""
    card = f"---\nlicense: {PROMPTS_LICENSE}\n---\n# prompts\n".encode()
    commit = hub.commit(PROMPTS, {"README.md": card, "train.jsonl": b'{"prompt": "hi"}\n'})
    return {
        "repo": PROMPTS,
        "revision": "main",
        "commit": commit,
        "selected_by": "split train",
        "files": ["train.jsonl"],
    }


def finished_dataset(
    root: Path, source: dict[str, Any] | None = None, *, rows: int = 60, shard_size: int = 20
) -> Storage:
    """A dataset whose run went to the end and whose audit passed."""
    storage = make_export_dataset(root, rows=rows, shard_size=shard_size, turns=1)
    run = json.loads(storage.read_bytes(RUN_KEY))
    commit = (source or {}).get("commit")
    run.update(
        input_path=f"hf://datasets/{PROMPTS}@{commit}" if commit else "prompts.jsonl",
        format="messages",
        model={"served_name": "qwen3-8b", "source": "hf://Qwen/Qwen3-8B", "revision": None},
        sampling={
            "max_tokens": 4096,
            "temperature": 0.6,
            "top_p": 0.95,
            "top_k": 20,
            "min_p": 0.0,
            "mix": [
                {"share": 0.7, "temperature": 0.6, "top_p": None, "top_k": None, "min_p": None},
                {"share": 0.3, "temperature": 1.0, "top_p": None, "top_k": None, "min_p": None},
            ],
        },
        regeneration={"turns": "last", "thinking": "save", "thinking_mix": {}},
        shard_size=shard_size,
        num_rows=rows,
        created="2026-12-08T09:00:00+00:00",
        revisions=[{"revision": 1, "rows": rows}],
        source=source or {},
    )
    storage.write_bytes(RUN_KEY, json.dumps(run, indent=2).encode())
    write_rejects(storage, pl.DataFrame(schema=REJECTS_SCHEMA))
    audit(storage)
    return storage


def audit(storage: Storage) -> AuditResult:
    """The audit as `regen audit` runs it: the report, its JSON and plots written."""
    result = run_audit(storage, AUDIT)
    write_report(storage, result)
    return result
