"""The walking skeleton end to end: `regen rehearse` as a user runs it, on emulated servers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from regen.dataset import read_committed
from regen.rehearsal import bundled
from regen.storage import LocalStorage
from tests.support.cli import run_regen

pytestmark = pytest.mark.timeout(400)


def _dataset(out: Path) -> pl.DataFrame:
    return read_committed(LocalStorage(out)).collect()


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, prefect_home: Path):
    import os

    work = tmp_path_factory.mktemp("rehearse")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(prefect_home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = run_regen(["rehearse", "--out", "out", "--servers", "2"], env, cwd=work)
    return work, proc, env


def test_rehearsal_writes_every_sample_once_and_passes_audit(first_run) -> None:
    work, proc, _ = first_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = work / "out"
    assert "dataset: out" in proc.stdout
    assert "audit: pass" in proc.stdout or "audit: warn" in proc.stdout
    sample = pl.read_ndjson(bundled("sample_prompts.jsonl"))
    data = _dataset(out)
    assert sorted(data["id"].to_list()) == sorted(sample["id"].to_list())
    assert data["id"].n_unique() == data.height >= 200
    assert data["error"].null_count() == data.height
    assert (data["content"].str.len_chars() > 0).all()
    assert (data["reasoning_content"].str.len_chars() > 0).all()
    for name in ("run.json", "progress.json", "report/audit.md", "report/audit.json"):
        assert (out / name).is_file(), name
    census = read_committed(LocalStorage(out)).census
    assert not (census.orphans or census.without_data or census.unusable), census
    assert json.loads((out / "progress.json").read_text())["done"] == data.height


def test_second_rehearsal_generates_nothing(first_run) -> None:
    work, proc, env = first_run
    assert proc.returncode == 0, proc.stderr
    out = work / "out"
    before = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    again = run_regen(["rehearse", "--out", "out", "--servers", "2"], env, cwd=work)
    assert again.returncode == 0, again.stderr
    after = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    assert after == before, "a committed shard was rewritten"
    log = again.stdout + again.stderr
    assert "generate-shard" not in log
    assert "launch-fleet" not in log, "a fleet was launched with nothing to generate"
    # The plan's headline: shards committed, none to generate (not "10 to generate").
    planned = re.search(r"; (\d+) committed, (\d+) to generate", log)
    assert planned is not None, log
    committed, pending = (int(n) for n in planned.groups())
    assert committed >= 1 and pending == 0, planned[0]
    # No request was sent: progress still counts the first run's rows and nothing more.
    progress = json.loads((out / "progress.json").read_text())
    assert progress["done"] == _dataset(out).height, progress


def test_missing_prompts_fail_before_any_server(tmp_path: Path, regen_env) -> None:
    proc = run_regen(
        ["rehearse", "--out", "out", "--prompts", "nope.jsonl", "--servers", "2"],
        regen_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "nope.jsonl" in proc.stderr
    assert not (tmp_path / ".regen" / "logs").exists(), "a server was launched"
    assert not (tmp_path / ".regen" / "stage").exists(), "the model was staged"
