"""`regen` run as a user runs it: a subprocess with ephemeral Prefect, from a chosen directory,
stopped with everything it started when the test does not wait for its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

from regen.machine.owned import OWNER_ENV, in_group, stop
from support.prefect import prefect_env


def regen_env(prefect_home: Path) -> dict[str, str]:
    """Ephemeral Prefect in `prefect_home`, no telemetry, no server URL, a patient first start."""
    return {**prefect_env(prefect_home), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}


def owned_by(pid: int) -> list[psutil.Process]:
    """The processes `regen` run `pid` tagged as its own (regen.machine.owned): its servers and
    Prefect's temporary server, each in a session of its own, and their children."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(OWNER_ENV, "").startswith(f"{pid}:"):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def stop_regen(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """Kill a `regen` started in its own session (its group: the run and what shares it) and
    stop what it owned: its servers and Prefect's server live in sessions of their own."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    victims = owned_by(proc.pid)
    stop(victims, grace_s, {p.pid for p in victims if in_group(p.pid, p.pid)})


@contextmanager
def regen_process(
    args: list[str], env: dict[str, str], cwd: Path, **popen: Any
) -> Iterator[subprocess.Popen[str]]:
    """`regen ARGS` from `cwd` in a session of its own; when the block is left before it ended
    (a timeout, pytest-timeout's alarm, a failed assertion), it is stopped with all it owned."""
    proc: subprocess.Popen[str] = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        **popen,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            stop_regen(proc)


def run_regen(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """`regen ARGS` as a user runs it, from `cwd`; past `timeout` it is stopped with all it
    started and TimeoutExpired raised."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with regen_process(args, env, cwd, **pipes) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            stop_regen(proc)
            with suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)  # drain and close the pipes
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
