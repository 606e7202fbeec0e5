"""A real SGLang server killed mid-run comes back (issue 44): `regen run` on two CPU servers,
server-1's whole group killed with SIGKILL once a shard has committed; regen's supervisor
relaunches it from its recorded command, it rejoins the dispatcher, and the run completes
with every id exactly once.

server-0 is held stopped (SIGSTOP) from just before the kill until server-1 is back, then
continued: on any machine the run cannot finish on server-0 alone while server-1 starts again
(100-130 s here under load), so rows are left for the relaunched server to answer. Its
requests meanwhile wait, on hang guards (the `two_server_run` fixture).
"""

from __future__ import annotations

import signal
from pathlib import Path

import polars as pl
import psutil

from regen.dataset import read_committed
from regen.fleet.process import FLEET_ID_ENV
from support.dataset import dataset_ids, read_progress
from tests.engine.live import LiveRun
from tests.support.cli import owned_by

START = "===== regen: server-1 starting at"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_server_is_relaunched_and_the_run_completes_exactly_once(
    two_server_run: LiveRun,
) -> None:
    run = two_server_run
    port_0, port_1 = sorted(run.servers())
    run.kill_server(port_0, signal.SIGSTOP)
    try:
        killed = run.kill_server(port_1)
        run.until(
            "server-1 back after its relaunch",
            lambda: (row := run.fleet().get("server-1")) is not None
            and row["relaunches"] == 1 and row["status"] == "healthy",
        )  # fmt: skip
        relaunched = run.servers()[port_1]["pid"]
        # All server-1 had generated before it came back: its first life's, server-0 stopped.
        tokens_when_back = run.server_tokens("server-1")
    finally:
        run.kill_server(port_0, signal.SIGCONT)
    code = run.wait()
    out = run.output()
    assert code == 0, out[-4000:]

    found = dataset_ids(run.storage)
    assert found.lost(run.ids()) == [] and found.doubled() == [] and not found.missing_data
    progress = read_progress(run.storage)
    assert progress["done"] == progress["total"] == len(run.ids()), progress

    fleet = run.fleet()
    assert fleet["server-1"]["relaunches"] == 1 and fleet["server-1"]["status"] == "healthy"
    [cause] = fleet["server-1"]["relaunch_causes"]
    assert "killed by SIGKILL (exit code -9)" in cause, cause
    assert fleet["server-0"]["relaunches"] == 0, fleet["server-0"]

    # Its log was appended: the first start, then the relaunch's, which came up.
    [log] = Path(run.config["work_dir"]).glob("runs/*/logs/server-1.log")
    text = log.read_text(errors="replace")
    assert text.count(START) == 2, text[-3000:]
    assert "fired up and ready to roll" in text.split(START)[2], text[-3000:]

    # The relaunched server answered rows: server-1's rows hold more tokens than it had
    # generated when it came back.
    rows = read_committed(run.storage).scan().collect()
    assert rows["error"].null_count() == rows.height, rows.filter(pl.col("error").is_not_null())
    answered = rows.filter(pl.col("server") == "server-1")["completion_tokens"].sum()
    assert answered > tokens_when_back, (answered, tokens_when_back)

    # Nothing left: neither life of server-1, nor anything the run owned or its fleet forked.
    assert not _alive(killed) and not _alive(relaunched)
    assert not owned_by(run.proc.pid)
    assert not [p for p in psutil.process_iter() if _fleet_of(p) in _fleet_ids(log)]
    assert not list(Path(run.config["work_dir"]).glob("runs/*/pids/*.json")), "PID files left"


def _fleet_ids(log: Path) -> set[str]:
    return {
        line.rsplit(", fleet ", 1)[1].split()[0]
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith(START)
    }


def _fleet_of(proc: psutil.Process) -> str | None:
    try:
        return proc.environ().get(FLEET_ID_ENV)
    except psutil.Error:
        return None
