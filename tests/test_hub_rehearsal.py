"""`regen rehearse --prompts hf://datasets/...` as a user runs it (issue 32): against the
loopback Hub, then over a new revision of the dataset (only its new rows are generated), then
on an "air-gapped" node: the Hub gone, HF_HUB_OFFLINE=1, the cache filled by the runs before.
(A rerun pinned to @commit is read in tests/test_hub_prompts.py, which costs no flow run.)

Requests are counted from the emulators' own logs (`Served N requests` at shutdown); the
launch's own (probes, one bench request per server) are the first run's count less its rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
import yaml

from regen.dataset import REJECTS_KEY, RUN_KEY, read_committed
from regen.storage import LocalStorage
from support.hub import loopback_hub
from tests.support.cli import run_regen
from tests.test_hub_prompts import parquet, ultrachat_rows

pytestmark = pytest.mark.timeout(600)

_SERVED = re.compile(r"Shutting down\. Served (\d+) requests\.")
REPO = "HuggingFaceH4/ultrachat"
PROMPTS = f"hf://datasets/{REPO}"


def _served(work: Path) -> int:
    """Requests the last run's emulators answered, from their logs (each run has its own)."""
    last = max(work.glob("runs/*"), key=lambda run: run.stat().st_mtime)
    logs = sorted(last.glob("logs/server-*.log"))
    counts = [_SERVED.findall(p.read_text()) for p in logs]
    assert logs and all(counts), "every server logs its count when it shuts down"
    return sum(int(c[-1]) for c in counts)


def _shards(rows: list[range]) -> dict[str, bytes]:
    """The train_sft split as push_to_hub writes it: n shards named -0000i-of-0000n."""
    n = len(rows)
    return {
        f"data/train_sft-{i:05d}-of-{n:05d}.parquet": parquet(ultrachat_rows(r.start, r.stop))
        for i, r in enumerate(rows)
    }


def _ids(out: Path) -> list[str]:
    return read_committed(LocalStorage(out)).collect()["id"].to_list()


def test_rehearse_from_the_hub_follows_main_and_runs_offline(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    config = {
        "work_dir": "work",
        "shard_size": 20,
        "input": {"split": "train_sft", "id_column": "prompt_id"},
        "engine": {"bench": {"concurrency": 1, "max_tokens": 16, "budget_s": 5.0}},
        # The test counts requests a row: a hedged copy of a straggler is a second one.
        "generation": {"hedge": "off"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    base = ["rehearse", "--config", "config.yaml", "--servers", "2"]
    args = [*base, "--prompts", PROMPTS]
    with loopback_hub() as hub:
        test_split = {"data/test_sft-00000-of-00001.parquet": parquet(ultrachat_rows(900, 920))}
        first = hub.commit(REPO, {**_shards([range(0, 30), range(30, 50)]), **test_split})
        env = {**regen_env, **hub.env(str(tmp_path / "hf"))}
        proc = run_regen([*args, "--out", "out"], env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = tmp_path / "out"
        ids = _ids(out)
        assert sorted(ids) == [f"uc-{i:05d}" for i in range(50)], "every id once"
        launch = _served(tmp_path / "work") - 50
        assert 0 <= launch < 20, launch
        rows = read_committed(LocalStorage(out)).collect()
        assert not rows["content"].str.contains("An old answer").any(), "the answer is new"
        run = json.loads((out / RUN_KEY).read_text())
        assert run["input_path"] == f"{PROMPTS}@{first}"
        assert (
            run["source"]["commit"] == first and run["source"]["selected_by"] == "split train_sft"
        )

        # A new revision on main: the split re-sharded with ten more rows, as push_to_hub does.
        shards = _shards([range(0, 20), range(20, 40), range(40, 60)])
        second = hub.commit(REPO, {**shards, **test_split}, replace=True)
        proc = run_regen([*args, "--out", "out"], env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _served(tmp_path / "work") - launch == 10, "only the new rows reach the servers"
        assert sorted(_ids(out)) == [f"uc-{i:05d}" for i in range(60)]
        assert pl.read_parquet(out / REJECTS_KEY).height == 0
        run = json.loads((out / RUN_KEY).read_text())
        read = [(r["new"], r["source"]["commit"]) for r in run["revisions"]]
        assert read == [(50, first), (10, second)], "each revision states the commit it read"
        asked = len(hub.requests)

    # Air-gapped: no Hub at all, the cache the runs above filled, a fresh dataset; the files
    # named by a glob this time.
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    glob = f"{PROMPTS}/data/train_sft-*.parquet"
    proc = run_regen([*base, "--prompts", glob, "--out", "offline"], offline, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(_ids(tmp_path / "offline")) == [f"uc-{i:05d}" for i in range(60)]
    run = json.loads((tmp_path / "offline" / RUN_KEY).read_text())
    assert run["input_path"] == f"{PROMPTS}@{second}/data/train_sft-*.parquet"
    assert run["source"]["commit"] == second
    assert len(hub.requests) == asked


def test_rehearse_names_an_unknown_repo_in_one_line(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    with loopback_hub() as hub:
        env = {**regen_env, **hub.env(str(tmp_path / "hf"))}
        proc = run_regen(
            ["rehearse", "--prompts", "hf://datasets/org/nope", "--servers", "2"], env, cwd=tmp_path
        )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("regen: run failed")]
    assert len(lines) == 1, proc.stderr
    assert "hf://datasets/org/nope: repository not found, or private" in lines[0]
    assert not list((tmp_path / ".regen").glob("runs/*/logs")), "a server was launched"
