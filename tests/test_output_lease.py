"""One run per output: the lease on a real directory and a real S3 API (moto on loopback).

Holders are real processes: a live one is a `sleep` this test started, a dead one a process
that ended, so the same-host liveness check is judged on real pids and start times.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import polars as pl
import psutil
import pytest

from regen.config import parse_config
from regen.dataset import ShardCommitted, commit_shard, supersede
from regen.dataset.keys import lease_key
from regen.generation.shard import worth_retrying
from regen.machine.owned import alive, this_machine
from regen.preflight import check_storage
from regen.schema import row_schema
from regen.storage import LocalStorage, Storage
from regen.storage.lease import Holder
from regen.storage.output_lease import LEASE_S, OutputHeld, OutputLease, live_holder, read_lease
from support.s3 import MotoS3, ignoring_if_none_match


class FakeClock:
    def __init__(self, now: float = 2_000_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "out")
    moto: MotoS3 = request.getfixturevalue("moto")
    return moto.storage(moto.create_bucket(), "datasets/out")


@pytest.fixture
def other_process() -> Iterator[psutil.Process]:
    """A live process of this host that is not the test: another run's holder."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _holder_of(proc: psutil.Process, run_id: str, host: str | None = None) -> Holder:
    me = Holder.this_process(run_id=run_id, flow_run_id=f"flow-{run_id}")
    return replace(me, pid=proc.pid, pid_started=proc.create_time(), host=host or me.host)


def test_a_second_run_is_refused_naming_the_holder(
    storage: Storage, other_process: psutil.Process
) -> None:
    first = OutputLease(storage, _holder_of(other_process, "run-a"))
    assert first.take() is None
    second = OutputLease(storage, Holder.this_process(run_id="run-b"))
    with pytest.raises(OutputHeld) as refused:
        second.take()
    line = str(refused.value)
    assert "\n" not in line
    assert f"pid {other_process.pid} on {first.holder.host}" in line
    assert "flow run flow-run-a" in line and "taken over" in line
    assert read_lease(storage).holder == first.holder  # type: ignore[union-attr]


def test_a_dead_holder_on_this_host_is_taken_over_at_once(storage: Storage) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    holder = _holder_of(psutil.Process(gone.pid), "run-a")
    gone.wait()
    OutputLease(storage, holder).take()
    taken = OutputLease(storage, Holder.this_process(run_id="run-b")).take()
    assert taken is not None and f"pid {gone.pid}" in taken and "is gone" in taken
    assert read_lease(storage).holder.run_id == "run-b"  # type: ignore[union-attr]


def test_another_hosts_holder_is_live_until_its_heartbeat_expires(storage: Storage) -> None:
    clock = FakeClock()
    elsewhere = replace(
        Holder.this_process(run_id="run-a"), host="gpu-node-7", pid=1, machine="b00t pid:[1]"
    )
    OutputLease(storage, elsewhere, clock=clock).take()
    mine = OutputLease(storage, Holder.this_process(run_id="run-b"), clock=clock)
    clock.now += LEASE_S - 1
    with pytest.raises(OutputHeld, match="on gpu-node-7"):
        mine.take()
    clock.now += 2
    taken = mine.take()
    assert taken is not None and "no heartbeat for 121 s" in taken


def _in_own_pid_namespace(storage_root: Path) -> subprocess.Popen[str] | None:
    """A run in a PID namespace of its own on this host (a container of a host-network pod:
    same hostname, its own PIDs), holding the output's lease; None where this machine cannot
    make one (no root, no user namespaces)."""
    take = (
        "import sys, time; from pathlib import Path; from regen.storage import LocalStorage; "
        "from regen.storage.lease import Holder; "
        "from regen.storage.output_lease import OutputLease; "
        "OutputLease(LocalStorage(Path(sys.argv[1])), Holder.this_process(run_id='pod-run'))"
        ".take(); print('held', flush=True); time.sleep(120)"
    )
    for isolate in (["--pid"], ["--user", "--map-root-user", "--pid"]):
        argv = [
            "unshare",
            *isolate,
            "--fork",
            "--kill-child",
            "--mount-proc",
            sys.executable,
            "-c",
            take,
        ]
        proc = subprocess.Popen(
            [*argv, str(storage_root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        if proc.stdout.readline().strip() == "held":
            return proc
        proc.wait()
    return None


def test_a_holder_in_another_pid_namespace_of_this_host_is_judged_by_its_heartbeat(
    tmp_path: Path,
) -> None:
    """Its PID means another process here (pid 1 of its namespace is this host's init): judged
    by PID, a live run was taken over at once. Judged by boot id and PID namespace, it holds the
    output until its heartbeat is older than the lease."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    storage = LocalStorage(tmp_path / "out")
    pod = _in_own_pid_namespace(tmp_path / "out")
    if pod is None:
        pytest.skip("this machine cannot make a PID namespace")
    try:
        holder = read_lease(storage).holder  # type: ignore[union-attr]
        assert holder is not None and holder.host == socket.gethostname()
        assert holder.machine is not None and holder.machine != this_machine()
        assert holder.pid != pod.pid and not alive(holder.pid, holder.pid_started), (
            "its PID names another process here, or none: the case a hostname check got wrong"
        )
        clock = FakeClock(time.time())
        mine = OutputLease(storage, Holder.this_process(run_id="run-b"), clock=clock)
        with pytest.raises(OutputHeld, match=r"pid \d+ on "):
            mine.take()
        assert live_holder(storage) == holder
        clock.now += LEASE_S + 1
        taken = mine.take()
        assert taken is not None and "no heartbeat for" in taken
    finally:
        pod.kill()
        pod.wait()


def test_a_record_written_before_the_machine_was_kept_reads_and_waits_for_its_heartbeat(
    storage: Storage,
) -> None:
    """A lease left by an older regen: no `machine` in its holder. It still reads, and its
    holder, whose PID cannot be placed, is judged by its heartbeat alone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    beat = time.time()
    holder = {"run_id": "old-run", "host": socket.gethostname(), "pid": gone.pid,
              "pid_started": started, "since": beat, "flow_run_id": None}  # fmt: skip
    record = {"generation": 4, "holder": holder, "heartbeat_at": beat}
    storage.create_exclusive(lease_key(4), json.dumps(record).encode())
    read = read_lease(storage)
    assert read is not None and read.holder is not None and read.holder.machine is None
    clock = FakeClock(beat + 1)
    mine = OutputLease(storage, Holder.this_process(run_id="run-b"), clock=clock)
    with pytest.raises(OutputHeld, match=f"pid {gone.pid} on "):
        mine.take()
    clock.now = beat + LEASE_S + 1
    taken = mine.take()
    assert taken is not None and "no heartbeat for" in taken
    assert read_lease(storage).generation == 5  # type: ignore[union-attr]


def test_renewal_keeps_it_release_frees_it_and_a_taken_over_lease_is_lost(
    storage: Storage,
) -> None:
    clock = FakeClock()
    lease = OutputLease(storage, Holder.this_process(run_id="run-a"), clock=clock)
    lease.take()
    for _ in range(5):
        clock.now += LEASE_S / 2
        lease.renew()
    assert lease.lost is None
    # Only the newest generations are kept, however often it was renewed.
    assert len(storage.list("lease/")) <= 2
    lease.release()
    assert OutputLease(storage, Holder.this_process(run_id="run-b")).take() is None
    lease.renew()
    assert lease.lost is not None and "taken over by" in lease.lost


def test_of_two_runs_racing_for_a_free_output_exactly_one_holds_it(storage: Storage) -> None:
    leases = [OutputLease(storage, Holder.this_process(run_id=f"run-{i}")) for i in range(4)]
    barrier = threading.Barrier(len(leases))

    def take(lease: OutputLease) -> bool:
        barrier.wait()
        try:
            lease.take()
            return True
        except OutputHeld:
            return False

    with ThreadPoolExecutor(len(leases)) as pool:
        won = list(pool.map(take, leases))
    # All four are this process: the loser sees a live holder (this pid) and is refused.
    assert sum(won) == 1, won
    assert read_lease(storage).holder.run_id == leases[won.index(True)].holder.run_id  # type: ignore[union-attr]


def test_a_node_joins_its_parents_lease_and_nothing_else(
    storage: Storage, other_process: psutil.Process
) -> None:
    parent = OutputLease(storage, _holder_of(other_process, "parent-run"))
    parent.take()
    node = OutputLease(storage, Holder.this_process(run_id="parent-run", flow_run_id="child"))
    node.join()  # no error, and it writes nothing
    node.renew()
    node.release()
    assert read_lease(storage).holder == parent.holder  # type: ignore[union-attr]
    stranger = OutputLease(storage, Holder.this_process(run_id="other-run"))
    with pytest.raises(OutputHeld):
        stranger.join()


def test_regen_check_fails_the_storage_row_of_a_held_output(
    tmp_path: Path, other_process: psutil.Process
) -> None:
    out = tmp_path / "out"
    config = parse_config({"model": {"source": "m", "served_name": "m"}, "prompts": "p.jsonl",
                           "output": str(out)})  # fmt: skip
    holder = _holder_of(other_process, "run-a")
    OutputLease(LocalStorage(out), holder).take()
    row = check_storage(config)
    assert row.status == "fail" and f"pid {other_process.pid}" in row.figure, row
    assert live_holder(LocalStorage(out)) == holder
    # The run that shares it (a node of that multi-node run) passes.
    assert check_storage(config, lease_run="run-a").status == "pass"


def test_a_superseded_run_leaves_the_lease_where_it_is(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    storage.write_bytes("run.json", b"{}")
    OutputLease(storage, Holder.this_process(run_id="run-a")).take()
    supersede(storage, "oldfingerprint")
    assert read_lease(storage) is not None
    assert not [k for k in storage.list("superseded/") if "lease" in k]


def _rows(shard: int) -> pl.DataFrame:
    return pl.DataFrame(
        {"id": [f"{shard}-0"], "shard": [shard], "messages": [[{"role": "user", "content": "q"}]],
         "content": ["a"], "reasoning_content": [None], "finish_reason": ["stop"],
         "prompt_tokens": [1], "completion_tokens": [1], "reasoning_tokens": [0], "model": ["m"],
         "server": ["server-0"], "attempts": [1], "latency_s": [0.1], "error": [None],
         "turns": [[]], "sampling": [None], "tools": [None]},
        schema=row_schema(),
    )  # fmt: skip


def test_a_commit_conflict_names_the_other_run_and_is_not_retried(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    commit_shard(storage, 3, _rows(3), fingerprint="fp", timings={}, node="node-2")
    with pytest.raises(ShardCommitted) as conflict:
        commit_shard(storage, 3, _rows(3), fingerprint="fp", timings={})
    assert "shard 3 is already committed (by node node-2, at " in str(conflict.value)
    assert "replace_shard" not in str(conflict.value)
    assert not worth_retrying(conflict.value)


def test_regen_check_refuses_a_store_that_ignores_if_none_match(
    moto: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto honours `If-None-Match: *` as S3 does; the same buckets behind an HTTP front that
    drops the header (as some S3 stand-ins do) let a second conditional PUT overwrite the first:
    two runs would both hold the lease. The storage row probes it once and says so."""
    bucket = moto.create_bucket()
    config = parse_config({"model": {"source": "m", "served_name": "m"}, "prompts": "p.jsonl",
                           "output": f"s3://{bucket}/out"})  # fmt: skip
    row = check_storage(config)
    assert row.status == "pass", row
    with ignoring_if_none_match(moto) as forgetful:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", forgetful.endpoint_url)
        refused = check_storage(config)
    assert refused.status == "fail", refused
    assert refused.figure.startswith(f"s3://{bucket}/out: the store ignores conditional writes")
    assert "\n" not in refused.figure and "If-None-Match: *" in refused.hint
    listed = moto.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert [o["Key"] for o in listed if "probe" in o["Key"]] == [], "a probe key was left"
