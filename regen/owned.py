"""Helper processes that must not outlive the run that started them, even a kill -9'd one.

Some processes a run starts are not ours to launch: the orchestrator's own temporary API
server, say, is started by a library in a subprocess with no way to ask it to die with its
parent. So the run tags its environment with its own identity before any such process
starts (children inherit it), and the next run stops every tagged process whose owner is
gone, just as `regen.fleet.orphans` does for servers. A process is stopped only when its
environment carries the tag of a dead owner and every `env_match` item: an untagged process,
or one whose owner still lives (a parallel run), is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping

import psutil

log = logging.getLogger(__name__)

OWNER_ENV = "REGEN_OWNER"


def _identity(proc: psutil.Process) -> str:
    """PID and start time: a PID alone may have been reused by an unrelated process."""
    return f"{proc.pid}:{proc.create_time():.2f}"


def tag_children() -> None:
    """Make this process the owner of every subprocess it starts from now on."""
    os.environ[OWNER_ENV] = _identity(psutil.Process())


def _owner_alive(tag: str) -> bool:
    pid, _, started = tag.partition(":")
    try:
        owner = psutil.Process(int(pid))
        if owner.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(owner.create_time() - float(started)) < 1.0
    except (ValueError, psutil.Error):
        return False


def orphans(env_match: Mapping[str, str | None]) -> list[psutil.Process]:
    """Processes tagged by an owner that is gone and whose environment has `env_match`
    (a None value: the variable must be unset)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except psutil.Error:  # another user's, or gone meanwhile
            continue
        tag = env.get(OWNER_ENV)
        if not tag or any(env.get(k) != v for k, v in env_match.items()):
            continue
        if not _owner_alive(tag):
            found.append(proc)
    return found


def reap_owned(env_match: Mapping[str, str | None], grace_s: float = 5.0) -> list[int]:
    """Stop (SIGTERM, then SIGKILL after `grace_s`) the orphans of `env_match`; their PIDs."""
    victims = orphans(env_match)
    for proc in victims:
        log.warning("stopping orphan pid %d of a run that is gone", proc.pid)
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    alive = wait_gone(victims, grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_gone(alive, 5.0)
    return sorted(p.pid for p in victims)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """The ones still running after `timeout_s`; a zombie counts as gone, as orphans are not
    our children and whoever adopted them reaps them in their own time. Shared with
    `regen.fleet.orphans`, which stops orphaned servers the same way."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive
