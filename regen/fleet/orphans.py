"""Stop servers left behind by a run whose owner died (kill -9, OOM, a lost node agent).

A process is stopped only if it is provably one of that run's servers: its environment
carries the run's `REGEN_FLEET_ID`, or (when the environment cannot be read) its command
line starts with the recorded argv and it started when the PID file says. A PID that was
reused by an unrelated process therefore survives. A fleet whose owner is still alive in
another process is not an orphan and is left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from regen.fleet.process import FLEET_ID_ENV, group_alive, signal_group
from regen.owned import wait_gone

log = logging.getLogger(__name__)

_START_SLACK_S = 5.0  # PID file written right after Popen; create_time is rounded


def _owner_alive(record: dict[str, Any]) -> bool:
    pid = record.get("owner_pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        owner = psutil.Process(pid)
        if owner.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(owner.create_time() - float(record.get("owner_started_at", 0))) < 1.0
    except psutil.Error:
        return False


def _is_ours(proc: psutil.Process, record: dict[str, Any]) -> bool:
    try:
        return proc.environ().get(FLEET_ID_ENV) == record.get("fleet_id")
    except psutil.AccessDenied:
        pass
    except psutil.Error:
        return False
    try:
        argv = record.get("argv") or []
        started = float(record.get("started_at", 0))
        return (
            bool(argv)
            and proc.cmdline()[: len(argv)] == argv
            and abs(proc.create_time() - started) < _START_SLACK_S
        )
    except psutil.Error:
        return False


def _fleet_processes(record: dict[str, Any]) -> list[psutil.Process]:
    """The recorded server and any process of its group or run that is still ours."""
    found = []
    pgid = record.get("pgid")
    for proc in psutil.process_iter():
        try:
            in_group = os.getpgid(proc.pid) == pgid
        except (ProcessLookupError, PermissionError):
            continue
        if (in_group or proc.pid == record.get("pid")) and _is_ours(proc, record):
            found.append(proc)
    return found


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def reap_orphans(work_dir: Path, grace_s: float = 5.0) -> list[int]:
    """Stop every orphaned server recorded under `work_dir/pids`; return the PIDs stopped."""
    pid_dir = Path(work_dir) / "pids"
    victims: dict[int, psutil.Process] = {}
    groups: set[int] = set()
    done_files = []
    for path in sorted(pid_dir.glob("server-*.json")):
        record = _read(path)
        if record is None:
            log.warning("ignoring unreadable PID file %s", path)
            continue
        if _owner_alive(record):
            continue
        for proc in _fleet_processes(record):
            victims[proc.pid] = proc
            if proc.pid == record.get("pgid"):
                groups.add(proc.pid)
        done_files.append(path)
    for proc in victims.values():
        log.warning("stopping orphan server pid %d (%s)", proc.pid, FLEET_ID_ENV)
        with_group = proc.pid in groups
        if with_group:
            signal_group(proc.pid, signal.SIGTERM)
        else:
            _signal(proc, signal.SIGTERM)
    alive = wait_gone(list(victims.values()), grace_s)
    for proc in alive:
        if proc.pid in groups:
            signal_group(proc.pid, signal.SIGKILL)
        else:
            _signal(proc, signal.SIGKILL)
    wait_gone(alive, 5.0)
    deadline = time.monotonic() + 2.0
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    for path in done_files:
        path.unlink(missing_ok=True)
        (Path(work_dir) / "secrets" / f"{path.stem}.yaml").unlink(missing_ok=True)
    return sorted(victims)


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(psutil.Error):
        proc.send_signal(sig)
