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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from regen.fleet.commands import RUNS_DIR
from regen.fleet.process import FLEET_ID_ENV
from regen.machine.owned import alive, in_group, mine, stop

log = logging.getLogger(__name__)

_START_SLACK_S = 5.0  # PID file written right after Popen; create_time is rounded


def _owner_alive(record: dict[str, Any]) -> bool:
    """Whether the run that wrote `record` still runs elsewhere: this process's own servers
    are its own to reap (an interrupted run stops its fleet through the reaper)."""
    pid = record.get("owner_pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    return alive(pid, float(record.get("owner_started_at", 0)))


def _is_ours(proc: psutil.Process, record: dict[str, Any]) -> bool:
    try:
        return proc.environ().get(FLEET_ID_ENV) == record.get("fleet_id")
    except psutil.AccessDenied:
        pass
    except psutil.Error:
        return False
    try:
        # The command line the server ran (recorded once up), else the one regen asked for.
        argv = record.get("cmdline") or record.get("argv") or []
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
        grouped = isinstance(pgid, int) and in_group(proc.pid, pgid)
        if (grouped or proc.pid == record.get("pid")) and _is_ours(proc, record):
            found.append(proc)
    return found


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


@dataclass(frozen=True)
class Orphan:
    """One server of a run whose owner is gone, with every process of it still running."""

    path: Path  # its PID file
    name: str
    port: int | None
    pgid: int | None
    processes: list[psutil.Process]

    @property
    def pids(self) -> list[int]:
        return sorted(p.pid for p in self.processes)

    def describe(self) -> str:
        """`server-0 (port 31200): pids 123, 124, 125` for check's row and the reaper's log."""
        pids = ", ".join(map(str, self.pids))
        return f"{self.name} (port {self.port}): pid{'s' if len(self.pids) > 1 else ''} {pids}"


def pid_files(work_dir: Path) -> list[Path]:
    """Every server PID file under `work_dir`: each run's (`runs/<run>/pids/`, see
    `regen.fleet.commands.run_dir`) and those of the layout before runs had their own."""
    root = Path(work_dir)
    return sorted(root.glob("pids/server-*.json")) + sorted(
        root.glob(f"{RUNS_DIR}/*/pids/server-*.json")
    )


def find_orphans(work_dir: Path) -> list[Orphan]:
    """The servers recorded under `work_dir` (every run's) whose owner is gone; a fleet whose
    owner still runs (a parallel run) is none of them. An orphan with no process left still
    counts: its PID file is what the reaper removes."""
    found = []
    for path in pid_files(work_dir):
        record = _read(path)
        if record is None:
            log.warning("ignoring unreadable PID file %s", path)
            continue
        if _owner_alive(record):
            continue
        port, pgid = record.get("port"), record.get("pgid")
        found.append(
            Orphan(
                path=path,
                name=path.stem,
                port=port if isinstance(port, int) else None,
                pgid=pgid if isinstance(pgid, int) else None,
                processes=_fleet_processes(record),
            )
        )
    return found


def reap_orphans(work_dir: Path, grace_s: float = 5.0) -> list[int]:
    """Stop every orphaned server recorded under `work_dir/pids`; return the PIDs stopped.

    As a teardown does: SIGTERM to the launcher first (SGLang stops its own children), the
    group after `grace_s`, SIGKILL to what is left."""
    found = find_orphans(work_dir)
    victims = {p.pid: p for orphan in found for p in orphan.processes}
    groups = {o.pgid for o in found if o.pgid is not None and o.pgid in victims}
    for orphan in found:
        if orphan.processes:
            log.warning("stopping orphan server %s (%s)", orphan.describe(), FLEET_ID_ENV)
    stop(list(victims.values()), grace_s, groups)
    for orphan in found:
        orphan.path.unlink(missing_ok=True)
        # The key file beside it: <dir>/pids/server-0.json -> <dir>/secrets/server-0.yaml.
        (orphan.path.parent.parent / "secrets" / f"{orphan.name}.yaml").unlink(missing_ok=True)
    return sorted(victims)


def reap_spawned(grace_s: float = 5.0) -> list[int]:
    """Stop every server this process launched that is still running, recorded or not; their
    PIDs. A Ctrl-C that lands between a server's fork and its PID file leaves it in a session
    of its own that no teardown knows of (seen once in CI, at the fleet's launch): it is found
    by the tags every server carries, this process as its owner and a fleet id."""
    victims = []
    for proc in mine({}):
        with contextlib.suppress(psutil.Error):
            if FLEET_ID_ENV in proc.environ():
                victims.append(proc)
    for proc in victims:
        log.warning("stopping server pid %d, launched as the run was interrupted", proc.pid)
    stop(victims, grace_s, {p.pid for p in victims if in_group(p.pid, p.pid)})
    return sorted(p.pid for p in victims)
