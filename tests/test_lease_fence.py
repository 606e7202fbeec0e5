"""The output's lease fences every commit: a run whose lease another run took over stops before
its next commit, in one line naming the new holder, and commits nothing after the takeover.

Before, `OutputLease.renew` noted the loss and nothing read it: the run kept generating and
committing beside the new holder. Holders are real processes, the rows come from real
emulators through the real dispatcher, and the rehearsal below is `regen rehearse` itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from regen.config import parse_config
from regen.dataset import read_manifest
from regen.dataset.keys import lease_key
from regen.generation.loop import run_all
from regen.generation.outcome import ShardOutcome
from regen.generation.run_plan import plan_run
from regen.generation.shard import Fence, generate_shard, worth_retrying
from regen.rehearsal import bundled
from regen.storage import LocalStorage, Storage
from regen.storage.lease import Holder, LeaseRecord
from regen.storage.output_lease import LEASE_S, LeaseLost, OutputLease, check_held, read_lease
from support.chaos import (
    ChaosRun,
    descendants,
    kill_leftovers,
    start_rehearsal,
    wait_until,
    write_chaos_config,
    write_prompt_subset,
)
from support.dataset import dataset_ids
from tests.test_dispatcher import dispatcher, served


@pytest.fixture
def other_process() -> Iterator[psutil.Process]:
    """A live process of this host that is not the test: the run that takes the lease over."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _holder_of(proc: psutil.Process, run_id: str) -> Holder:
    me = Holder.this_process(run_id=run_id, flow_run_id=f"flow-{run_id}")
    return replace(me, pid=proc.pid, pid_started=proc.create_time())


def _take_over(storage: Storage, new: Holder) -> None:
    """What a second run does on a holder that looks dead (stalled past its lease): it writes
    the lease's next generation, naming itself."""
    OutputLease(storage, new, clock=lambda: time.time() + LEASE_S + 1).take()
    assert read_lease(storage).holder == new  # type: ignore[union-attr]


def _config(tmp_path: Path, rows: int) -> Any:
    prompts = tmp_path / "prompts.jsonl"
    lines = (json.dumps({"id": f"r{i}", "prompt": f"question {i}?"}) for i in range(rows))
    prompts.write_text("\n".join(lines) + "\n")
    return parse_config(
        {
            "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
            "prompts": str(prompts),
            "output": str(tmp_path / "out"),
            "work_dir": str(tmp_path / "work"),
            "shard_size": 4,
            "engine": {"kind": "external", "urls": ["http://127.0.0.1:1"]},
        },
        "test",
    )


def test_a_run_whose_lease_is_taken_over_stops_before_its_next_commit(
    tmp_path: Path, other_process: psutil.Process
) -> None:
    config = _config(tmp_path, 20)
    storage = LocalStorage(tmp_path / "out")
    mine = OutputLease(storage, Holder.this_process(run_id="run-a"))
    assert mine.take() is None
    plan = plan_run(config, storage)
    assert plan.lease_run == "run-a" and len(plan.pending) == 5
    thief = _holder_of(other_process, "run-b")
    started: list[int] = []
    with served(2) as fleet, dispatcher(fleet) as rows, futures.ThreadPoolExecutor(1) as pool:

        def submit(shard: int, lease: Fence | None) -> futures.Future[ShardOutcome]:
            started.append(shard)
            return pool.submit(generate_shard, shard, plan, rows, storage)

        def taken_after_first(outcome: ShardOutcome) -> None:
            if outcome.shard == plan.pending[0]:
                _take_over(storage, thief)

        result = run_all(plan.pending, submit, window=1, on_outcome=taken_after_first)
    assert [o.shard for o in result.outcomes] == [0]
    assert started == [0, 1], "a shard started after the lease was lost"
    assert result.failures == []
    lost = result.fatal
    assert isinstance(lost, LeaseLost), lost
    line = str(lost)
    assert "\n" not in line
    assert f"shard 000001 not committed: output lease lost to pid {other_process.pid}" in line
    assert "flow run flow-run-b" in line
    assert not worth_retrying(lost)
    assert [k for k in storage.list("shards/") if k.endswith(".json")] == [
        "shards/shard-000000.json"
    ]
    # The new holder's record stands: the run that lost it neither renewed nor released it.
    mine.renew()
    mine.release()
    assert mine.lost is not None and f"pid {other_process.pid}" in mine.lost
    assert read_lease(storage).holder == thief  # type: ignore[union-attr]


def test_a_lost_lease_fences_the_replacement_of_a_committed_shard_too(
    tmp_path: Path, other_process: psutil.Process
) -> None:
    """`generation.retry_errors` swaps rows into a committed shard (`replace_shard`): fenced
    like a first commit."""
    config = _config(tmp_path, 4)
    storage = LocalStorage(tmp_path / "out")
    OutputLease(storage, Holder.this_process(run_id="run-a")).take()
    plan = plan_run(config, storage)
    with served(1) as fleet, dispatcher(fleet) as rows:
        generate_shard(0, plan, rows, storage)
        before = read_manifest(storage, 0)
        _take_over(storage, _holder_of(other_process, "run-b"))
        with pytest.raises(LeaseLost, match="shard 000000 not committed: output lease lost to"):
            generate_shard(0, plan, rows, storage, retry_errors=True)
    assert read_manifest(storage, 0) == before


def test_the_fence_names_what_became_of_the_lease(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    with pytest.raises(LeaseLost, match="output lease gone"):
        check_held(storage, "run-a")
    lease = OutputLease(storage, Holder.this_process(run_id="run-a"))
    lease.take()
    check_held(storage, "run-a")  # held: no error
    # A release written by another process of the same run id: nobody holds it any more.
    now = time.time()
    storage.create_exclusive(lease_key(1), LeaseRecord(1, None, now, now).to_json())
    with pytest.raises(LeaseLost, match="output lease released by another run"):
        check_held(storage, "run-a")


def _manifests(out: Path) -> set[str]:
    shards = out / "shards"
    return {p.name for p in shards.glob("shard-*.json")} if shards.exists() else set()


@pytest.mark.timeout(400)
def test_a_rehearsal_whose_lease_is_taken_over_ends_in_one_line(
    tmp_path: Path, regen_env: dict[str, str], other_process: psutil.Process
) -> None:
    """The whole run: stalled (SIGSTOP, a suspended VM) past its lease, another run takes the
    output over; woken, the run commits nothing more and ends in one line naming that run."""
    prompts = write_prompt_subset(bundled("sample_prompts.jsonl"), tmp_path / "p.jsonl", 120)
    config = write_chaos_config(tmp_path / "regen.yaml", tmp_path / "work", time_scale=0.3)
    out = tmp_path / "out"
    run = ChaosRun(config=config, out=str(out), work_dir=tmp_path / "work", prompts=prompts)
    log = tmp_path / "run.log"
    proc = start_rehearsal(run, {**regen_env, "PYTHONUNBUFFERED": "1"}, tmp_path, log)
    try:
        assert wait_until(lambda: bool(_manifests(out)), proc, 300), log.read_text()[-4000:]
        os.kill(proc.pid, signal.SIGSTOP)
        before = _manifests(out)
        storage = LocalStorage(out)
        thief = _holder_of(other_process, "run-b")
        _take_over(storage, thief)
        os.kill(proc.pid, signal.SIGCONT)
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            kill_leftovers(descendants(proc.pid))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = log.read_text()
    assert rc == 1, said[-4000:]
    failed = [x for x in said.splitlines() if x.startswith("regen: run failed")]
    assert len(failed) == 1, said[-4000:]
    assert f"not committed: output lease lost to pid {other_process.pid} on " in failed[0]
    assert "flow run flow-run-b" in failed[0] and "Traceback" not in said
    assert "Retry 1/" not in said
    print(failed[0])
    assert _manifests(out) == before, "a shard was committed after the takeover"
    assert read_lease(storage).holder == thief, "the stopped run wrote over the new holder"  # type: ignore[union-attr]
    ids = dataset_ids(storage)
    assert ids.doubled() == [], ids
