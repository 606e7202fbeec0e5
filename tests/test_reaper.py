"""Nothing a test starts outlives it, a timeout included: the engine lane's reaper
(support/reaper.py), run in a pytest session of its own with a timeout of seconds over tests
that start emulators in sessions of their own (as regen's servers are) and never stop them;
and a `regen` subprocess a test leaves running (tests/support/cli.py), with its servers and
Prefect's temporary server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from regen.machine.owned import alive
from support import REPO
from support.chaos import write_chaos_config
from support.reaper import SCOPE_ENV, reap, tagged
from tests.support.cli import owned_by, regen_process

HANG_GUARD_S = 120

CONFTEST = """
from support.reaper import pytest_fixture_post_finalizer as pytest_fixture_post_finalizer
from support.reaper import pytest_fixture_setup as pytest_fixture_setup
from support.reaper import pytest_runtest_call as pytest_runtest_call
from support.reaper import pytest_runtest_setup as pytest_runtest_setup
from support.reaper import pytest_sessionfinish as pytest_sessionfinish
from support.reaper import reaped_summary as pytest_terminal_summary
"""

# Each process it starts is noted (PID, start time, scope) in NOTES before the test hangs.
COMMON = """
import json, os, time
from pathlib import Path
import psutil, pytest
from support.emulator import Emulator

def launch(logs: Path, what: str) -> None:
    emulator = Emulator.launch(logs)  # a session of its own, like regen's servers
    proc = psutil.Process(emulator.proc.pid)
    with open(os.environ["NOTES"], "a") as notes:
        notes.write(json.dumps({"what": what, "pid": proc.pid, "started": proc.create_time(),
                                "scope": os.environ["REGEN_TEST_SCOPE"]}) + "\\n")
"""

SIGNAL_TESTS = (
    COMMON
    + """
@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    launch(tmp_path_factory.mktemp("m"), "module fixture")
    yield

@pytest.fixture
def function_server(tmp_path):
    launch(tmp_path, "function fixture")
    yield

@pytest.mark.timeout(5, func_only=True)
def test_hangs_in_its_body(module_server, function_server, tmp_path):
    launch(tmp_path, "test body")
    time.sleep(600)

@pytest.fixture(scope="module")
def hangs_in_set_up(tmp_path_factory):
    launch(tmp_path_factory.mktemp("h"), "set-up that hung")
    time.sleep(600)

@pytest.mark.timeout(5)
def test_whose_fixture_hangs(hangs_in_set_up):
    pass
"""
)

THREAD_TESTS = (
    COMMON
    + """
@pytest.fixture
def server(tmp_path):
    launch(tmp_path, "before os._exit")
    yield

@pytest.mark.timeout(5, method="thread")
def test_hangs_then_exits(server):
    time.sleep(600)
"""
)


Notes = list[dict[str, Any]]


@pytest.fixture
def inner(tmp_path: Path) -> Iterator[Path]:
    """The inner session's directory; whatever of it a failed check left is stopped after."""
    yield tmp_path / "inner"
    for note in _notes(tmp_path / "inner"):
        reap(note["scope"].split("/")[0], grace_s=1)


def _notes(tmp: Path) -> Notes:
    path = tmp / "notes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _inner_session(tmp: Path, tests: str) -> tuple[subprocess.CompletedProcess[str], Notes]:
    """A pytest session over `tests` with the reaper's hooks; its output and its notes."""
    tmp.mkdir()
    (tmp / "conftest.py").write_text(CONFTEST)
    (tmp / "test_inner.py").write_text(tests)
    # Nothing of the outer session's: its scope, its xdist worker, its current test.
    env = {k: v for k, v in os.environ.items() if k != SCOPE_ENV and not k.startswith("PYTEST_")}
    env.update(NOTES=str(tmp / "notes.jsonl"), PYTHONPATH=str(REPO))
    args = ["-p", "no:randomly", "-p", "no:cacheprovider", "-p", "no:xdist", "-q"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, str(tmp)],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    return done, _notes(tmp)


def _left(notes: Notes, timeout_s: float) -> Notes:
    """The noted processes still running after up to `timeout_s` (a PID may be reused: the
    start time says whether it is still the same process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [n for n in notes if alive(n["pid"], n["started"])]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_timeout_stops_what_the_test_and_its_fixtures_started(inner: Path) -> None:
    done, notes = _inner_session(inner, SIGNAL_TESTS)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Timeout" in out, out[-4000:]
    assert "1 failed, 1 error" in out, out[-4000:]
    whats = ["module fixture", "function fixture", "test body", "set-up that hung"]
    assert sorted(n["what"] for n in notes) == sorted(whats), notes
    # Stopped before the session ended, each by the end of the scope that started it: the
    # fixture whose set-up timed out at once, not when its module ended.
    assert _left(notes, timeout_s=0) == []
    summary = out.split("processes the reaper stopped", 1)[-1]
    for what in ["test_inner.py::test_hangs_in_its_body", "fixture function_server:",
                 "fixture module_server:", "fixture hangs_in_set_up (set-up failed):"]:  # fmt: skip
        assert what in summary, summary
    token = notes[0]["scope"].split("/")[0]
    assert tagged(token) == []


def test_a_hard_exit_of_pytest_leaves_nothing_behind(inner: Path) -> None:
    """pytest-timeout's thread method ends pytest with os._exit: no finalizer runs, so the
    watchdog is what stops the emulator (as it would after a SIGKILL to pytest)."""
    done, notes = _inner_session(inner, THREAD_TESTS)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Timeout" in out, out[-4000:]
    assert "processes the reaper stopped" not in out  # no finalizer, no summary
    assert [n["what"] for n in notes] == ["before os._exit"]
    assert _left(notes, timeout_s=HANG_GUARD_S) == []
    token = notes[0]["scope"].split("/")[0]
    deadline = time.monotonic() + HANG_GUARD_S
    while tagged(token) or _watchdogs(token):  # the watchdog exits once it has reaped
        assert time.monotonic() < deadline, (tagged(token), _watchdogs(token))
        time.sleep(0.2)


def _watchdogs(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if token in proc.cmdline():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_regen_left_running_is_stopped_with_its_servers(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    """A rehearsal left before it ended (a timeout, a failed assertion): the run, its emulators
    and Prefect's temporary server, each in a session of its own, are all stopped; and all
    of them carried the scope of whatever started the run, which the lane's reaper relies on."""
    config = write_chaos_config(tmp_path / "regen.yaml", tmp_path / "work", time_scale=1.0)
    scope = f"probe-{uuid.uuid4().hex[:8]}"
    env = {**regen_env, SCOPE_ENV: scope}
    args = ["rehearse", "--config", str(config), "--out", str(tmp_path / "out"), "--servers", "2"]
    log = tmp_path / "run.log"
    with log.open("w") as out:
        try:
            with regen_process(args, env, tmp_path, stdout=out, stderr=subprocess.STDOUT) as proc:
                deadline = time.monotonic() + HANG_GUARD_S
                while len(list((tmp_path / "work").glob("runs/*/pids/server-*.json"))) < 2:
                    assert proc.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
                started = [psutil.Process(proc.pid), *owned_by(proc.pid)]
                marks = [(p.pid, p.create_time()) for p in started]
                kinds = " ".join(" ".join(p.cmdline()) for p in started)
                assert "regen.emulator" in kinds and "uvicorn" in kinds, kinds  # Prefect's
                assert {p.pid for p in started} <= {p.pid for p in tagged(scope)}
                raise TimeoutError("the test gave up on the run")
        except TimeoutError:
            pass
    left = [pid for pid, at in marks if alive(pid, at)]
    try:
        assert left == [] and tagged(scope) == [], left
    finally:
        reap(scope, grace_s=1)  # a failed check leaves nothing to the next test
