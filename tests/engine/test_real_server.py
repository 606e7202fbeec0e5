"""regen's own flow against the real SGLang 0.5.23 server, run on this CPU (`engine.device: cpu`)
with a tiny random-weight Qwen3: launch from regen's argv, probes, the benchmark, generation in
several shards with `turns: all`, a kill -9 mid-generation and the rerun that resumes it, the
audit's template parity and loss mask from the stored ids, an over-long prompt, a wrong key,
teardown through SGLang's graceful path, and the emulator's rows beside the real server's.

The model's text is one planted answer (support/tiny_model.py): the quality checks it cannot
pass are measured and not judged (audit.not_judged); every assertion here is on mechanics.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import pytest
import yaml

from regen.dataset import manifested_shards, read_committed
from regen.fleet.process import FLEET_ID_ENV
from regen.lossmask import samples_from_ids
from regen.machine.ports import quiet_port_range
from regen.storage import LocalStorage
from support.dataset import dataset_ids, read_progress
from support.engine import HANG_GUARD_S, engine_config, write_prompts
from support.prefect import Server
from tests.engine.live import running
from tests.support.cli import owned_by, regen_process, run_regen

THINK_END = 84  # `</think>` in the bundled tokenizer (ids contiguous 0-85)


def _write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def _fleet_processes(fleet_ids: set[str] | None = None) -> list[psutil.Process]:
    """Processes that carry a fleet's marker (servers and every child they forked)."""
    found = []
    for proc in psutil.process_iter():
        try:
            fleet = proc.environ().get(FLEET_ID_ENV)
        except psutil.Error:
            continue
        if fleet and (fleet_ids is None or fleet in fleet_ids):
            found.append(proc)
    return found


def _fleet_ids_of(work_dir: Path) -> set[str]:
    ids = set()
    for path in work_dir.glob("runs/*/pids/server-*.json"):
        ids.add(json.loads(path.read_text())["fleet_id"])
    return ids


@dataclass
class Resumed:
    """The killed run and the rerun that finished it."""

    tmp: Path
    config: dict[str, Any]
    ids: list[str]
    killed_pids: list[int]
    committed_before: dict[int, bytes]
    check: subprocess.CompletedProcess[str]
    rerun: subprocess.CompletedProcess[str]

    @property
    def storage(self) -> LocalStorage:
        return LocalStorage(Path(self.config["output"]))

    def rows(self) -> pl.DataFrame:
        return read_committed(self.storage).scan().collect()


@pytest.fixture(scope="module")
def resumed(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, lane_prefect: Server
) -> Resumed:
    """`regen run` on two real CPU servers, killed with SIGKILL once a shard has committed;
    `regen check`; then the same `regen run` again, to the end."""
    tmp = tmp_path_factory.mktemp("engine-run")
    ids = write_prompts(tmp / "prompts.jsonl", single=150, multi=4, too_long=1)
    base = quiet_port_range(2)
    # Two requests per server: slow enough that the kill lands with shards still to generate.
    config = engine_config(tmp, tiny_model, tmp / "prompts.jsonl", base)
    config["concurrency_per_server"] = 2
    env = lane_prefect.env_now()  # taken here: what it starts carries this fixture's scope
    with running(tmp, config, env) as first:
        assert sorted(first.servers()) == [base, base + 1]
        # regen alone: its servers are in sessions of their own, orphaned for the rerun.
        os.kill(first.proc.pid, signal.SIGKILL)
        first.wait(timeout=30)
    storage = first.storage
    committed = {
        s: storage.read_bytes(f"shards/shard-{s:06d}.json") for s in manifested_shards(storage)
    }
    killed = [p.pid for p in _fleet_processes(_fleet_ids_of(Path(config["work_dir"])))]
    path = tmp / "node.yaml"
    # A wide terminal: the table's cells are not wrapped mid-phrase.
    wide = {**env, "COLUMNS": "400"}
    check = run_regen(["check", "--config", str(path)], wide, tmp, HANG_GUARD_S)
    rerun = run_regen(["run", "--config", str(path)], env, tmp, HANG_GUARD_S)
    return Resumed(tmp, config, ids, killed, committed, check, rerun)


def test_the_killed_runs_servers_are_named_then_reaped(resumed: Resumed) -> None:
    assert resumed.killed_pids, "the killed run's servers outlive it (their own sessions)"
    out = resumed.check.stdout
    assert resumed.check.returncode == 0, out + resumed.check.stderr
    assert "earlier run's servers" in out and "regen run stops them" in out
    for port in (resumed.config["engine"]["base_port"], resumed.config["engine"]["base_port"] + 1):
        assert f"(port {port}): pid" in out
    assert resumed.rerun.returncode == 0, resumed.rerun.stdout[-4000:] + resumed.rerun.stderr
    # Every process of the killed fleet, SGLang's schedulers and detokenizers included.
    assert not [p for p in resumed.killed_pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]  # fmt: skip


def test_the_rerun_generates_only_what_is_missing_every_id_once(resumed: Resumed) -> None:
    found = dataset_ids(resumed.storage)
    assert found.lost(resumed.ids) == [] and found.doubled() == [] and not found.missing_data
    for shard, manifest in resumed.committed_before.items():
        # A shard committed before the kill is never generated again.
        assert resumed.storage.read_bytes(f"shards/shard-{shard:06d}.json") == manifest
    progress = read_progress(resumed.storage)
    assert progress["done"] == progress["total"] == len(resumed.ids), progress
    assert progress["already_done"] >= len(resumed.committed_before) * 20


def test_the_killed_runs_server_logs_are_kept(resumed: Resumed) -> None:
    logs = sorted(Path(resumed.config["work_dir"]).glob("runs/*/logs/server-*.log"))
    assert len(logs) == 4, logs  # two servers, two runs
    assert all("fired up and ready to roll" in p.read_text() for p in logs)


def test_rows_hold_the_servers_own_ids_per_turn(resumed: Resumed) -> None:
    rows = resumed.rows().filter(pl.col("error").is_null())
    assert rows.height == len(resumed.ids) - 1  # the over-long prompt is an error row
    for row in rows.iter_rows(named=True):
        turns = row["turns"]
        assert len(turns) == (2 if row["id"].startswith("m") else 1), row["id"]
        for turn in turns:
            assert len(turn["prompt_token_ids"]) == turn["prompt_tokens"], row["id"]
            assert len(turn["response_token_ids"]) == turn["completion_tokens"], row["id"]
        assert row["completion_tokens"] == sum(t["completion_tokens"] for t in turns)
        last = turns[-1]
        # The reasoning split on `</think>` by the real qwen3 parser: the tokens before it are
        # the reasoning (counted up to and including it), the rest the answer.
        assert THINK_END in last["response_token_ids"], row["id"]
        assert last["reasoning_tokens"] == last["response_token_ids"].index(THINK_END) + 1
        assert row["reasoning_content"] and "<think>" not in row["reasoning_content"]
        assert row["content"] and "</think>" not in row["content"]
        assert row["finish_reason"] == "stop"


def test_the_loss_mask_comes_from_the_stored_ids(resumed: Resumed) -> None:
    rows = resumed.rows().filter(pl.col("error").is_null())
    samples = samples_from_ids(rows.lazy()).collect()
    assert samples.height == sum(len(t) for t in rows["turns"])
    for sample in samples.iter_rows(named=True):
        mask = sample["loss_mask"]
        assert len(mask) == len(sample["input_ids"]) and sum(mask) == sample["loss_tokens"]
        assert mask[-sample["loss_tokens"] :] == [1] * sample["loss_tokens"]


def test_template_parity_and_the_error_row_carry_the_servers_word(resumed: Resumed) -> None:
    audit = json.loads(resumed.storage.read_bytes("report/audit.json"))
    checks = {c["name"]: c for c in audit["checks"]}
    assert (
        checks["template_parity"]["status"] == "pass" and checks["template_parity"]["figure"] == 0
    )
    assert checks["completeness"]["status"] == "pass"
    assert "from stored token ids" in checks["loss_mask"]["detail"]
    [error] = resumed.rows().filter(pl.col("error").is_not_null()).to_dicts()
    assert error["id"] == "long0"
    assert "longer than the model's context length (2048 tokens)" in error["error"]


def test_teardown_leaves_nothing_and_takes_sglangs_graceful_path(resumed: Resumed) -> None:
    work = Path(resumed.config["work_dir"])
    assert not _fleet_processes(_fleet_ids_of(work) | _every_fleet_id(work))
    rerun_logs = _newest_run_logs(work)
    for log in rerun_logs:
        text = log.read_text()
        assert "Gracefully exiting" in text or "SIGTERM received" in text, log
        assert "crashed with exit code" not in text, log


def _every_fleet_id(work: Path) -> set[str]:
    ids = set()
    for log in work.glob("runs/*/logs/server-*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("===== regen:") and ", fleet " in line:
                ids.add(line.rsplit(", fleet ", 1)[1].split()[0])
    return ids


def _newest_run_logs(work: Path) -> list[Path]:
    runs = sorted(work.glob("runs/*"), key=lambda p: p.stat().st_mtime)
    return sorted(runs[-1].glob("logs/server-*.log"))


def test_the_emulator_answers_with_the_real_servers_row_shape(
    resumed: Resumed, tiny_model: Path, regen_env: dict[str, str]
) -> None:
    """The same prompts through the emulator (same model directory) give rows with the same
    columns, dtypes and null pattern: the emulator's fidelity, judged by the real server."""
    tmp = resumed.tmp / "emulated"
    tmp.mkdir()
    config = engine_config(tmp, tiny_model, resumed.tmp / "prompts.jsonl", quiet_port_range(2),
                           engine={"kind": "emulator", "device": "cuda", "servers": None,
                                   "gpus": [0, 1], "python": sys.executable,
                                   "emulator": {"answer_tokens": "4:12",
                                                "reasoning_tokens": "4:12"}})  # fmt: skip
    config["engine"].pop("servers")
    path = _write_config(tmp / "emu.yaml", config)
    done = run_regen(["run", "--config", str(path)], regen_env, tmp, HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    real = resumed.rows().sort("id")
    emulated = read_committed(LocalStorage(Path(config["output"]))).scan().collect().sort("id")
    assert emulated.schema == real.schema
    assert emulated["id"].to_list() == real["id"].to_list()
    nulls = [pl.col(c).is_null().alias(c) for c in real.columns]
    assert emulated.select(nulls).equals(real.select(nulls)), _null_diff(real, emulated)


def _null_diff(real: pl.DataFrame, emulated: pl.DataFrame) -> str:
    lines = []
    for column in real.columns:
        a, b = real[column].is_null(), emulated[column].is_null()
        if not a.equals(b):
            ids = real.filter(a != b)["id"].head(3).to_list()
            lines.append(f"{column}: real null {a.sum()}, emulated null {b.sum()}, e.g. {ids}")
    return "\n".join(lines)


def test_a_wrong_api_key_stops_the_run_with_the_401(
    tmp_path: Path, tiny_model: Path, one_server: tuple[str, str], regen_env: dict[str, str]
) -> None:
    url, key = one_server
    write_prompts(tmp_path / "prompts.jsonl", single=4, multi=0, too_long=0)
    config = engine_config(tmp_path, tiny_model, tmp_path / "prompts.jsonl", 1,
                           engine={"kind": "external", "urls": [url], "servers": None,
                                   "api_key": f"not-{key}"})  # fmt: skip
    for launch_only in ("servers", "extra_args"):
        config["engine"].pop(launch_only)
    path = _write_config(tmp_path / "wrong-key.yaml", config)
    with regen_process(["run", "--config", str(path)], regen_env, tmp_path,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:  # fmt: skip
        out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 1, out[-4000:]
    assert "401" in out and "API key" in out, out[-4000:]
    assert key not in out
    # Nothing the run started is left (any helper it tagged).
    assert not owned_by(proc.pid)
