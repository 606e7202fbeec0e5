"""regen.machine.owned: a tagged helper process is stopped once its owner is gone, and only then."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from regen.machine.owned import orphans, reap_owned

MATCH = {"PREFECT__SERVER_EPHEMERAL": "1"}

# An owner that tags itself, then starts one matching helper and one that does not match.
OWNER = """
import os, subprocess, sys, time
from regen.machine.owned import tag_children
tag_children()
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
server = subprocess.Popen(sleep, env={**os.environ, "PREFECT__SERVER_EPHEMERAL": "1"})
other = subprocess.Popen(sleep)
print(server.pid, other.pid, flush=True)
time.sleep(120)
"""


@pytest.fixture
def owner() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    server, other = (int(p) for p in proc.stdout.readline().split())
    yield proc, server, other
    for pid in (proc.pid, server, other):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_helper_of_a_killed_owner_is_stopped_and_nothing_else(
    owner: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, server, other = owner
    assert server not in [p.pid for p in orphans(MATCH)], "its owner still runs"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _running(server) and _running(other), "a kill -9 leaves both behind"
    assert server in reap_owned(MATCH, grace_s=5)
    assert not _running(server)
    assert _running(other), "a process without the matching environment was stopped"
    assert server not in [p.pid for p in orphans(MATCH)]
