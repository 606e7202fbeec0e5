"""`regen status OUTPUT`: a run at a glance from its dataset root alone (local or S3), from
any shell, no Prefect: progress, the ETA as a clock time, tok/s, the live gate, the holder."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from flows.cli import main
from regen.dataset.keys import progress_key
from regen.progress.snapshot import ProgressSnapshot, ServerProgress
from regen.progress.status import read_status
from regen.storage import LocalStorage, Storage, open_storage
from regen.storage.lease import Holder
from regen.storage.output_lease import OutputLease
from support.s3 import MotoS3

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def _root(kind: str, tmp_path: Path, moto: MotoS3 | None) -> str:
    if kind == "s3":
        assert moto is not None
        return f"s3://{moto.create_bucket('regen-status')}/datasets/run"
    return str(tmp_path / "out")


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    moto = request.getfixturevalue("moto") if request.param == "s3" else None
    return _root(request.param, tmp_path, moto)


def _snapshot(**changes: object) -> ProgressSnapshot:
    snap = ProgressSnapshot(
        updated_at=NOW - 4, elapsed_s=600, total=6000, done=3628, already_done=0, ok=3620,
        failed=8, in_flight=64, queued=10, retries=1, shards_committed=7, rows_committed=3500,
        output_tokens=38_000_000, tokens_per_s=64_321.0, rows_per_s=6.0, eta_s=2462.0,
        servers=(ServerProgress("server-0", "healthy", 32, 32, 32_000.0),),
        audit={"rows": 3500, "shards": 7, "quarantined": [],
               "checks": {"truncation": {"figure": 0.004, "status": "pass"}}},
    )  # fmt: skip
    return replace(snap, **changes)  # type: ignore[arg-type]


def _status(root: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["status", root])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_output_without_a_run_is_one_line_and_exit_1(
    root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _status(root, capsys)
    assert code == 1 and out == ""
    uri = open_storage(root).uri
    assert err == f"regen: error: {uri}: no run here (no run.json and no progress.json)\n"


def test_a_run_in_progress_shows_its_figures_and_holder(
    root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """progress.json as the run writes it (`ProgressSnapshot.to_json`) and the lease as
    `OutputLease` takes it, read back from the root alone."""
    storage = open_storage(root)
    storage.write_bytes(progress_key(), _snapshot().to_json())
    # Renewed 10 s before the status is read.
    lease = OutputLease(storage, Holder.this_process(flow_run_id="f1e2"), clock=lambda: NOW - 10)
    assert lease.take() is None
    status = read_status(storage, now=NOW)
    lines = dict(line.split(":", 1) for line in status.lines())
    text = "\n".join(status.lines())
    host = socket.gethostname()
    assert re.search(rf"running: pid \d+ on {re.escape(host)} since .*flow run f1e2", lines["run"])
    assert lines["run"].endswith("; lease renewed 10.0 s ago"), text
    assert "3,628 / 6,000 rows generated (60.5 %)" in lines["progress"], text
    assert "64.3k output tok/s, 6.00 rows/s (the last minute)" in lines["speed"], text
    # The ETA measured 4 s before now: the clock time it names, and the time left from now.
    assert lines["ETA"].strip() == "08:40 UTC, in 41.0 min", text
    assert lines["live gate"].strip() == (
        "quality ok · rolling audit over 3,500 rows: every check within thresholds"
    ), text
    assert lines["updated"].strip() == "07:59 UTC, 4.00 s ago", text
    # From another shell: the same lines through the command, exit 0.
    code, out, _ = _status(root, capsys)
    assert code == 0 and "running: pid" in out and "rows generated" in out
    lease.release()
    released = "\n".join(read_status(storage, now=NOW).lines())
    assert "not running (the last run released the output at" in released


def test_a_finished_and_a_stopped_run_say_how_they_ended(tmp_path: Path) -> None:
    storage: Storage = LocalStorage(tmp_path / "out")
    finished = _snapshot(done=6000, ended="finished", eta_s=None)
    storage.write_bytes(progress_key(), finished.to_json())
    text = "\n".join(read_status(storage, now=NOW).lines())
    assert re.search(r"^ended: +finished in 10.0 min$", text, re.M), text
    assert "(this run's average over 10.0 min)" in text and "ETA" not in text
    storage.write_bytes(progress_key(), _snapshot(ended="stopped: rolling gate ...").to_json())
    assert "stopped by the live gate" in "\n".join(read_status(storage, now=NOW).lines())


def test_a_killed_run_is_not_running_and_says_why(tmp_path: Path) -> None:
    """kill -9: the lease is never released and the flow's hook may mark the progress
    Crashed; the status names the dead holder and why it is dead (its pid gone on this host)."""
    from regen.progress.snapshot import mark_state

    storage: Storage = LocalStorage(tmp_path / "out")
    storage.write_bytes(progress_key(), _snapshot().to_json())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    holder = replace(Holder.this_process(), pid=int(gone.stdout))
    assert OutputLease(storage, holder, clock=lambda: NOW - 10).take() is None
    mark_state(storage, "Crashed")
    lines = dict(line.split(":", 1) for line in read_status(storage, now=NOW).lines())
    assert lines["run"].strip().startswith(f"not running: its last holder (pid {holder.pid} on ")
    assert lines["run"].endswith(f"ended without release: its process (pid {holder.pid} on "
                                 f"{holder.host}) is gone")  # fmt: skip
    assert lines["ended"].strip() == "Crashed (no ETA: the run's process is gone)"
    assert "ETA" not in lines and "this run's average" in lines["speed"]


def test_a_multi_node_run_shows_each_node(tmp_path: Path) -> None:
    """Each node of a multi-node run writes its own progress; the root has none of its own."""
    storage: Storage = LocalStorage(tmp_path / "out")
    storage.write_bytes(progress_key("node-1"), _snapshot(total=3000, done=1500).to_json())
    storage.write_bytes(progress_key("node-2"), _snapshot(ended="finished").to_json())
    lines = read_status(storage, now=NOW).lines()
    text = "\n".join(lines)
    assert re.search(r"^progress: +see each node; 0 rows committed in 0 shards$", text, re.M)
    assert re.search(
        r"^node node-1: 1,500 / 3,000 rows generated \(50.0 %\); 64.3k output tok/s; "
        r"08:40 UTC, in 41.0 min$", text, re.M,
    ), text  # fmt: skip
    assert re.search(
        r"^node node-2: 3,628 / 6,000 rows generated \(60.5 %\); finished$", text, re.M
    )


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_status_of_a_real_rehearsal_while_it_runs_and_once_it_is_over(
    kind: str, tmp_path: Path, regen_env: dict[str, str], moto_s3: MotoS3
) -> None:
    """A slowed `regen rehearse` in one process, `regen status` from another as a user
    watching it would: running with a holder, progress and an ETA, then finished."""
    from support.chaos import write_chaos_config

    out = _root(kind, tmp_path, moto_s3)
    env = {**regen_env, **(moto_s3.env if kind == "s3" else {})}
    config = write_chaos_config(tmp_path / "regen.yaml", tmp_path / "work", time_scale=0.1)
    args = ["rehearse", "--config", str(config), "--out", out, "--servers", "2"]
    run = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def status() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", "status", out],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    seen: list[str] = []
    try:
        while run.poll() is None:
            now = status()
            if now.returncode == 0 and re.search(r"^ETA: +\d\d:\d\d UTC, in ", now.stdout, re.M):
                seen.append(now.stdout)
                break
            time.sleep(0.5)
        said, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, said[-3000:]
    assert seen, f"no status showed the run going; the run said:\n{said[-3000:]}"
    going = seen[0]
    print(f"\nwhile it ran:\n{going}")
    assert re.search(rf"^run: +running: pid \d+ on {re.escape(socket.gethostname())}", going, re.M)
    assert re.search(r"^progress: +[\d,]+ / 240 rows generated", going, re.M), going
    assert re.search(r"^speed: +\S+ output tok/s", going, re.M), going
    assert re.search(r"^live gate: ", going, re.M), going
    over = status()
    print(f"once over:\n{over.stdout}")
    assert over.returncode == 0, over.stderr
    assert "not running (the last run released the output at" in over.stdout
    assert re.search(
        r"^progress: +240 / 240 rows generated \(100 %\); 240 rows committed", over.stdout, re.M
    )
    assert re.search(r"^ended: +finished in ", over.stdout, re.M), over.stdout
    assert re.search(r"^audit: +(PASS|WARN) over 240 rows", over.stdout, re.M), over.stdout
