"""Helper processes that must not outlive the run that started them, even a kill -9'd one.

Some processes a run starts are not ours to launch: the orchestrator's own temporary API
server, say, is started by a library in a subprocess with no way to ask it to die with its
parent. So the run tags its environment with its own identity before any such process
starts (children inherit it), and the next run stops every tagged process whose owner is
gone, just as `regen.fleet.orphans` does for servers. A process is stopped only when its
environment carries the tag of a dead owner and every `env_match` item: an untagged process,
or one whose owner still lives (a parallel run), is left alone.

This module is the one owner of "is that process still the one we recorded" (`alive`, and
`ended_here` for a record another process table may have written) and of stopping what a dead
owner left (`stop`), for helpers and servers alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection, Mapping
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

OWNER_ENV = "REGEN_OWNER"


def _identity(proc: psutil.Process) -> str:
    """PID and start time: a PID alone may have been reused by an unrelated process."""
    return f"{proc.pid}:{proc.create_time():.2f}"


def tag_children() -> None:
    """Make this process the owner of every subprocess it starts from now on."""
    os.environ[OWNER_ENV] = _identity(psutil.Process())


def alive(pid: int, started_at: float) -> bool:
    """Whether process `pid`, started at `started_at` (epoch seconds), still runs: a PID alone
    may have been reused by an unrelated process, and a zombie holds nothing any more.

    One answer for every owner regen records (a helper's tag, a server's PID file, the output
    lease's holder). A process this user may not read counts as alive: what it holds is left
    alone rather than taken or stopped on a guess."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - started_at) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def this_machine() -> str | None:
    """The process table a PID of this process is read in: the kernel's boot id (another
    machine or another boot has another) and this process's PID namespace (containers that
    share a hostname, as host-network pods do, need not share one). None where either cannot
    be read (not Linux): a PID recorded there is never judged from anywhere.

    A hostname is not this: two containers with one hostname and their own PID namespaces see
    each other's PIDs as unrelated processes, and a live owner would be judged gone."""
    try:
        return f"{_BOOT_ID.read_text().strip()} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def ended_here(machine: str | None, pid: int, started_at: float) -> bool:
    """Whether process `pid`, started at `started_at` and recorded in `machine`'s process
    table (`this_machine()` where it ran), has ended, as this process can tell: only when that
    table is this one. Elsewhere, or for a record that did not say (None), it cannot tell and
    answers False, so the owner is judged by what it wrote (a heartbeat), never by a PID that
    means another process here."""
    return machine is not None and machine == this_machine() and not alive(pid, started_at)


def _owner_alive(tag: str) -> bool:
    pid, _, started = tag.partition(":")
    try:
        return alive(int(pid), float(started))
    except ValueError:  # not a tag we wrote
        return False


def orphans(env_match: Mapping[str, str | None]) -> list[psutil.Process]:
    """Processes tagged by an owner that is gone and whose environment has `env_match`
    (a None value: the variable must be unset)."""
    return [proc for proc, tag in _tagged(env_match) if not _owner_alive(tag)]


def mine(env_match: Mapping[str, str | None]) -> list[psutil.Process]:
    """Processes this one tagged (`tag_children`) whose environment has `env_match`."""
    me = _identity(psutil.Process())
    return [proc for proc, tag in _tagged(env_match) if tag == me]


def _tagged(env_match: Mapping[str, str | None]) -> list[tuple[psutil.Process, str]]:
    """Other processes with an owner's tag and `env_match` (None: the variable unset)."""
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
        if tag and all(env.get(k) == v for k, v in env_match.items()):
            found.append((proc, tag))
    return found


def reap_owned(env_match: Mapping[str, str | None], grace_s: float = 5.0) -> list[int]:
    """Stop (SIGTERM, then SIGKILL after `grace_s`) the orphans of `env_match`; their PIDs."""
    victims = orphans(env_match)
    for proc in victims:
        log.warning("stopping orphan pid %d of a run that is gone", proc.pid)
    stop(victims, grace_s)
    return sorted(p.pid for p in victims)


def stop(victims: list[psutil.Process], grace_s: float, groups: Collection[int] = ()) -> None:
    """The one reaper of what a dead owner left: SIGTERM, SIGKILL what outlives `grace_s`.

    `groups` are process groups whose leader is among `victims` (a server's launcher): the
    leader alone gets the first SIGTERM, as SGLang then stops its own children on its
    graceful path; the whole group gets SIGTERM after `grace_s`, and SIGKILL 2 s later."""
    for proc in victims:
        # A leader, or a process whose leader is already gone.
        if proc.pid in groups or not any(in_group(proc.pid, g) for g in groups):
            _signal(proc, signal.SIGTERM)
    left = wait_gone(victims, grace_s)
    if groups:
        for group in groups:
            signal_group(group, signal.SIGTERM)
        left = wait_gone(left, 2.0)
    for proc in left:
        if proc.pid in groups:
            signal_group(proc.pid, signal.SIGKILL)
        else:
            _signal(proc, signal.SIGKILL)
    wait_gone(left, 5.0)
    deadline = time.monotonic() + 2.0
    while any(group_alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """The ones still running after `timeout_s`; a zombie counts as gone, as orphans are not
    our children and whoever adopted them reaps them in their own time."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the group (zombies hold no GPU or port)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a whole process group; a group already gone is the goal, not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def in_group(pid: int, pgid: int) -> bool:
    """Whether process `pid` is in group `pgid` (a process gone is in none)."""
    try:
        return os.getpgid(pid) == pgid
    except (ProcessLookupError, PermissionError):
        return False


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(psutil.Error):
        proc.send_signal(sig)
