"""A server spawned as a Ctrl-C lands, between its fork and its PID file, is in a session of its
own that no teardown knows of (seen once in CI: `test_interrupt`'s fleet stage left one). An
interrupted run stops it by the tags every server carries: this run as its owner, a fleet id.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from regen.fleet.orphans import reap_spawned
from regen.fleet.process import FLEET_ID_ENV
from regen.machine.owned import OWNER_ENV, tag_children

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    before = os.environ.get(OWNER_ENV)
    tag_children()
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()
    if before is None:
        os.environ.pop(OWNER_ENV, None)
    else:
        os.environ[OWNER_ENV] = before


def test_an_unrecorded_server_of_this_run_is_stopped_and_nothing_else(
    started: list[subprocess.Popen[bytes]],
) -> None:
    server = subprocess.Popen(SLEEP, env={**os.environ, FLEET_ID_ENV: "f1"}, start_new_session=True)
    helper = subprocess.Popen(SLEEP, env=dict(os.environ))  # ours, but no server
    stranger = subprocess.Popen(  # a server of another owner
        SLEEP, env={**os.environ, OWNER_ENV: "1:1.00", FLEET_ID_ENV: "f2"}
    )
    started += [server, helper, stranger]
    psutil.Process(server.pid).environ()  # exec'd: its environment is the one given

    assert reap_spawned(grace_s=5) == [server.pid]
    assert server.wait(timeout=10) is not None
    assert helper.poll() is None and stranger.poll() is None
