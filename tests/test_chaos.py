"""Chaos: `regen rehearse` killed mid-generation (kill -9, SIGTERM, SIGINT) and run again.

A kill -9 leaves its emulators orphaned (they are in their own sessions, as on a node whose
agent died); the rerun must reap them and finish with every input id exactly once and no
committed manifest touched. SIGTERM and SIGINT must stop the run promptly, leave no server,
a parseable progress.json and a dataset whose every manifest has its data.

Seven rehearsal subprocesses in all, chained so that each signal's rerun is the next trial:
locally SIGTERM -> SIGINT on the first half of the prompts, then the input grows to all of
them (a scheduled rerun's revised plan) and that run is killed -9 once it has committed a new
shard -> rerun; on moto S3 kill -9 -> rerun killed -9 right after its last commit (its fleet
still up) -> rerun with nothing to generate. They share one
`prefect server`, so each pays interpreter and flow start-up but no ephemeral Prefect start.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from flows.runner import EPHEMERAL_SERVER_ENV
from regen.dataset import manifested_shards, read_manifest
from regen.machine.owned import OWNER_ENV, orphans
from regen.rehearsal import bundled
from regen.storage import LocalStorage, Storage
from support.chaos import (
    ChaosRun,
    ManifestMark,
    ProcessMark,
    descendants,
    input_ids,
    kill_leftovers,
    kill_servers,
    leftovers,
    local_marks,
    rewritten,
    s3_marks,
    server_records,
    start_rehearsal,
    surviving_servers,
    wait_until,
    write_chaos_config,
    write_prompt_subset,
)
from support.dataset import dataset_ids, manifest_keys, read_progress
from support.prefect import Server, prefect_server
from support.s3 import MotoS3, moto_server

pytestmark = pytest.mark.timeout(600)

Marks = Callable[[], dict[str, ManifestMark]]
NUM_SHARDS = 12  # 240 sample prompts in shards of 20
PROMPT_ID_COUNT = 240


@pytest.fixture(scope="module")
def prefect(prefect_server_home: Path) -> Iterator[Server]:
    with prefect_server(prefect_server_home, startup_timeout=240) as server:
        yield server


@pytest.fixture
def seed() -> int:
    """Random kill moments, printed so that a failing run can be replayed."""
    value = int(os.environ.get("REGEN_CHAOS_SEED", time.time_ns() % 10_000))
    print(f"chaos seed {value} (REGEN_CHAOS_SEED to replay)")
    return value


class Trial:
    """One chained rehearsal setup: its runs, their logs and every server they recorded."""

    def __init__(
        self, tmp_path: Path, out: str, env: dict[str, str], run: ChaosRun | None = None
    ) -> None:
        self.cwd = tmp_path
        work = tmp_path / "work"
        if run is None:
            config = write_chaos_config(tmp_path / "regen.yaml", work)
            run = ChaosRun(config=config, out=out, work_dir=work)
        self.run = run
        self.env = env
        self.records: dict[int, dict[str, Any]] = {}
        self.killed: list[ProcessMark] = []  # every process of the runs killed so far
        self.attempt = 0

    def start(self) -> subprocess.Popen:
        self.attempt += 1
        return start_rehearsal(self.run, self.env, self.cwd, self.log(self.attempt))

    def log(self, attempt: int) -> Path:
        return self.cwd / f"attempt-{attempt}.log"

    def note_servers(self) -> list[dict[str, Any]]:
        """Remember every PID file seen so far; the reaper deletes those it handled."""
        for record in server_records(self.run.work_dir):
            self.records[int(record["pid"])] = record
        return list(self.records.values())

    def servers_of(self, proc: subprocess.Popen) -> list[dict[str, Any]]:
        return [r for r in self.note_servers() if r.get("owner_pid") == proc.pid]

    def output(self) -> str:
        logs = sorted(self.cwd.glob("*.log"))
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)


@pytest.fixture
def cleanup() -> Iterator[list[Trial]]:
    """Whatever a failed check left running is killed, so the next test starts clean."""
    trials: list[Trial] = []
    yield trials
    for trial in trials:
        kill_servers(trial.note_servers())
        kill_leftovers(trial.killed)


def _mid_generation(
    trial: Trial,
    proc: subprocess.Popen,
    storage: Storage,
    rng: random.Random,
    committed: int,
    shards: int = NUM_SHARDS,
) -> int:
    """Wait for a random shard commit past `committed` (of `shards`) while this run's fleet
    is up."""
    target = committed + rng.randint(1, 2)
    reached = wait_until(
        lambda: bool(trial.servers_of(proc)) and len(manifest_keys(storage)) >= target,
        proc,
        timeout_s=300,
        poll_s=0.05,
    )
    time.sleep(rng.uniform(0.0, 0.2))
    done = len(manifest_keys(storage))
    assert reached and proc.poll() is None, f"run ended before shard {target}:\n{trial.output()}"
    assert done < shards, f"generation was over ({done} shards) before the signal"
    return done


def _kill9(
    trial: Trial, storage: Storage, rng: random.Random, marks: Marks, committed: int = 0
) -> tuple[list[dict[str, Any]], dict[str, ManifestMark]]:
    """kill -9 the flow process past `committed` shards; its servers and committed manifests."""
    proc = trial.start()
    _mid_generation(trial, proc, storage, rng, committed)
    trial.killed += descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    orphans = trial.servers_of(proc)
    # The point of the trial: the servers outlive their owner until a rerun reaps them.
    assert orphans and len(surviving_servers(orphans, timeout_s=0)) == len(orphans)
    return orphans, marks()


def _rerun_completes(
    trial: Trial, storage: Storage, before: dict[str, ManifestMark], marks: Marks
) -> None:
    proc = trial.start()
    rc = proc.wait(timeout=400)
    assert rc == 0, trial.output()
    ids = dataset_ids(storage)
    expected = input_ids(bundled("sample_prompts.jsonl"))
    assert len(expected) == PROMPT_ID_COUNT
    assert not ids.missing_data
    assert ids.lost(expected) == [] and ids.doubled() == [], (ids.lost(expected), ids.doubled())
    assert len(ids.ids) == PROMPT_ID_COUNT
    assert rewritten(before, marks()) == [], "a committed manifest was rewritten"
    assert len(manifest_keys(storage)) == NUM_SHARDS
    assert surviving_servers(trial.note_servers()) == []
    assert server_records(trial.run.work_dir) == [], "PID files left after a clean run"
    # Not only the servers: nothing any killed run started is still running.
    assert leftovers(trial.killed) == [], "processes of a killed run left running"


def _signal_stops_cleanly(
    trial: Trial, storage: Storage, rng: random.Random, sig: signal.Signals, shards: int
) -> dict[str, ManifestMark]:
    """SIGTERM/SIGINT mid-generation: prompt non-zero exit, no server, consistent output."""
    committed = len(manifest_keys(storage))
    proc = trial.start()
    _mid_generation(trial, proc, storage, rng, committed, shards)
    servers = trial.servers_of(proc)
    started = descendants(proc.pid)
    sent, sent_at = time.monotonic(), time.time()
    os.kill(proc.pid, sig)
    try:
        # A hang guard only: a busy machine sets how many seconds a stop takes.
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{sig.name}: still running 60 s later:\n{trial.output()}")
    took = time.monotonic() - sent
    assert rc != 0, f"{sig.name}: exit 0 after an interrupted run"
    # It stopped, not drained: no shard it committed was started after the signal, as one
    # would be by a run that took the signal for a request to finish its work first.
    late = _started_after(storage, sent_at)
    assert late == [], f"{sig.name}: shards {late} started after the signal and committed"
    assert surviving_servers(servers, timeout_s=5) == [], f"{sig.name}: servers left"
    assert leftovers(started, timeout_s=5) == [], f"{sig.name}: processes left"
    assert server_records(trial.run.work_dir) == [], f"{sig.name}: PID files left"
    read_progress(storage)
    assert dataset_ids(storage).missing_data == []
    print(f"{sig.name}: exit {rc} in {took:.1f} s, {len(manifest_keys(storage))} shards")
    return local_marks(Path(trial.run.out))


def _started_after(storage: Storage, moment: float) -> list[int]:
    """Committed shards whose generation started after `moment` (epoch seconds): a manifest
    is written `generate_s` after its shard started (a little more, for the write)."""
    late = []
    for shard in sorted(manifested_shards(storage)):
        manifest = read_manifest(storage, shard)
        assert manifest is not None
        written = datetime.fromisoformat(manifest.written_at).timestamp()
        if written - manifest.timings["generate_s"] > moment:
            late.append(shard)
    return late


def test_sigterm_sigint_then_kill9_of_a_grown_input_then_rerun_local(
    tmp_path: Path, prefect: Server, seed: int, cleanup: list[Trial]
) -> None:
    rng = random.Random(seed)
    env = {**prefect.env, "PYTHONUNBUFFERED": "1"}
    work, out = tmp_path / "work", str(tmp_path / "out")
    half = write_prompt_subset(
        bundled("sample_prompts.jsonl"), tmp_path / "half.jsonl", PROMPT_ID_COUNT // 2
    )
    config = write_chaos_config(tmp_path / "regen.yaml", work)
    trial = Trial(tmp_path, out, env, ChaosRun(config=config, out=out, work_dir=work, prompts=half))
    cleanup.append(trial)
    storage = LocalStorage(tmp_path / "out")

    def marks() -> dict[str, ManifestMark]:
        return local_marks(tmp_path / "out")

    after_term = _signal_stops_cleanly(trial, storage, rng, signal.SIGTERM, NUM_SHARDS // 2)
    after_int = _signal_stops_cleanly(trial, storage, rng, signal.SIGINT, NUM_SHARDS // 2)
    assert rewritten(after_term, after_int) == []
    # The input grows to every prompt: the run revises its plan (new ids in new shards) and is
    # killed once at least one new shard has committed.
    trial.run = replace(trial.run, prompts=bundled("sample_prompts.jsonl"))
    orphans, killed_marks = _kill9(trial, storage, rng, marks, committed=NUM_SHARDS // 2)
    assert rewritten(after_int, killed_marks) == []
    _rerun_completes(trial, storage, killed_marks, marks)
    assert surviving_servers(orphans) == [], "the rerun left the kill -9 run's servers"
    revisions = json.loads((tmp_path / "out" / "run.json").read_text())["revisions"]
    assert len(revisions) == 2, revisions  # the grown input once, not again on the rerun


def test_kill9_then_rerun_on_s3(
    tmp_path: Path, prefect: Server, seed: int, cleanup: list[Trial]
) -> None:
    with moto_server() as moto:
        _kill9_s3(tmp_path, prefect, moto, random.Random(seed), cleanup)


def _kill9_s3(
    tmp_path: Path, prefect: Server, moto: MotoS3, rng: random.Random, cleanup: list[Trial]
) -> None:
    bucket, prefix = moto.create_bucket("regen-chaos"), "datasets/chaos"
    env = {**prefect.env, **moto.env, "PYTHONUNBUFFERED": "1"}
    trial = Trial(tmp_path, f"s3://{bucket}/{prefix}", env)
    cleanup.append(trial)
    storage = moto.storage(bucket, prefix)
    client = moto.client()

    def marks() -> dict[str, ManifestMark]:
        return s3_marks(client, bucket, prefix)

    orphans, killed_marks = _kill9(trial, storage, rng, marks)
    assert killed_marks and len(killed_marks) < NUM_SHARDS
    last = _kill9_after_last_commit(trial, storage)
    assert surviving_servers(orphans) == [], "the rerun left the kill -9 run's servers"
    assert rewritten(killed_marks, marks()) == []
    _rerun_completes(trial, storage, marks(), marks)
    if last:
        assert "0 to generate" in trial.log(trial.attempt).read_text()


def _kill9_after_last_commit(trial: Trial, storage: Storage) -> list[str]:
    """kill -9 right after the last commit, before teardown; the servers it left alive.

    The rerun then has nothing to generate and launches no fleet, yet must stop them. The
    window is short: when the kill misses it (servers already gone) there is nothing to reap.
    """
    proc = trial.start()
    wait_until(lambda: len(manifest_keys(storage)) >= NUM_SHARDS, proc, 300, poll_s=0.02)
    trial.killed += descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    alive = surviving_servers(trial.servers_of(proc), timeout_s=0)
    print(f"kill -9 after the last commit: {len(alive)} server(s) left running")
    return alive


def test_kill9_leaves_no_prefect_server_after_the_next_run(
    tmp_path: Path, regen_env: dict[str, str], cleanup: list[Trial]
) -> None:
    """Ephemeral Prefect, as a user's rehearsal runs it: kill -9 leaves its temporary API
    server running (Prefect stops it only at a clean exit); the next run must stop it, and
    leave none of its own."""
    work = tmp_path / "work"
    prompts = write_prompt_subset(bundled("sample_prompts.jsonl"), tmp_path / "p.jsonl", 20)
    config = write_chaos_config(tmp_path / "regen.yaml", work, shard_size=10)
    out = str(tmp_path / "out")
    run = ChaosRun(config=config, out=out, work_dir=work, servers=1, prompts=prompts)
    trial = Trial(tmp_path, out, regen_env, run)
    cleanup.append(trial)
    killed = trial.start()
    # The fleet is up only once the flow runs, so Prefect's server is up and in use by then.
    assert wait_until(lambda: bool(trial.servers_of(killed)), killed, 240), trial.output()
    servers = [m for m in descendants(killed.pid) if m.kind == "prefect"]
    assert len(servers) == 1, descendants(killed.pid)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=10)
    assert leftovers(servers, timeout_s=0) == servers, "nothing to reap: the test proves nothing"
    try:
        rerun = trial.start()
        assert rerun.wait(timeout=400) == 0, trial.output()
        assert leftovers(servers, timeout_s=5) == [], "the killed run's Prefect server lives on"
        assert "stopped 1 orphan Prefect server" in trial.log(trial.attempt).read_text()
        # The rerun's own server is stopped at its exit: no tagged server of either run is left.
        owners = {killed.pid, rerun.pid}
        left = [p for p in orphans(EPHEMERAL_SERVER_ENV) if _owner_pid(p) in owners]
        assert left == [], left
    finally:
        kill_leftovers(servers)


def _owner_pid(proc: psutil.Process) -> int | None:
    try:
        return int(proc.environ().get(OWNER_ENV, "").partition(":")[0])
    except (psutil.Error, ValueError):
        return None
