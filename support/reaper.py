"""Every process a test starts is stopped when the fixture or test that started it ends, however
it ends: an assertion, pytest-timeout's alarm, or the pytest process itself dying outright.

A process is known by a tag in its environment, `REGEN_TEST_SCOPE`: this pytest session's token
and the fixture or test being set up or run when it started. Children inherit the environment,
so a `regen` subprocess, the servers it launches in sessions of their own, SGLang's schedulers
and Prefect's temporary server all carry the tag of whatever started the run; nothing else is
ever touched (another session's processes carry another token, an engineer's next door none).

The whole suite re-exports the session's two hooks (tests/conftest.py): whatever a test, a
fixture or a `regen` it runs leaves behind when its pytest process ends, or is killed, is
stopped (a suite killed by an outer timeout once left its Prefect servers and workers running
for an hour, at 8 % of a core each). Per fixture and per test, the hooks act where a conftest
re-exports them (tests/engine/conftest.py), on that directory's tests alone: each costs a scan
of the machine's processes. A fixture's processes are stopped after its teardown, or at once
when its set-up raised (a timed-out module fixture would otherwise keep its servers until the
module ends); a test body's right after the call. Session-scoped fixtures are set up outside
these hooks: theirs carry the bare token and are stopped at the session's end. pytest-timeout's
thread method (an `os._exit`), a SIGKILL or SIGTERM to pytest and a second Ctrl-C skip every
finalizer: a watchdog (`python -m support.reaper PID STARTED TOKEN`, started with the session)
waits for the pytest process to end and then stops whatever carries its token.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

from regen.machine.owned import alive, in_group, stop
from support import REPO

SCOPE_ENV = "REGEN_TEST_SCOPE"
# SGLang's launcher stops its scheduler and detokenizer on SIGTERM in a few seconds; what is
# left after this gets the group's SIGTERM, then SIGKILL (regen.machine.owned.stop).
GRACE_S = 5.0


def tagged(tag: str) -> list[psutil.Process]:
    """Processes other than this one whose scope is `tag` or a scope under it."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            scope = proc.environ().get(SCOPE_ENV, "")
        except psutil.Error:  # another user's, or gone meanwhile
            continue
        if scope == tag or scope.startswith(f"{tag}/"):
            found.append(proc)
    return found


def reap(tag: str, grace_s: float = GRACE_S) -> list[str]:
    """Stop every process of scope `tag` (leaders first, then their groups, then SIGKILL);
    one line per process stopped, for the session's summary."""
    victims = tagged(tag)
    lines = []
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            lines.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:160]}")
    groups = {p.pid for p in victims if in_group(p.pid, p.pid)}
    stop(victims, grace_s, groups)
    return lines


@dataclass
class Lane:
    """This session's token, its scopes' counter, its watchdog and what was stopped."""

    token: str
    watchdog: subprocess.Popen[bytes]
    finished: bool = False
    numbers: itertools.count[int] = field(default_factory=itertools.count)
    stopped: list[str] = field(default_factory=list)
    scopes: dict[int, str] = field(default_factory=dict)  # id(fixturedef) -> its scope

    def new_scope(self) -> str:
        return f"{self.token}/{next(self.numbers)}"

    def reap(self, tag: str, what: str) -> None:
        lines = reap(tag)
        self.stopped += [f"{what}: {line}" for line in lines]


_LANE = pytest.StashKey[Lane]()


def _lane(config: pytest.Config) -> Lane:
    """The session's lane, started with its first test: the token in this process's
    environment (every child inherits it) and the watchdog."""
    lane = config.stash.get(_LANE, None)
    if lane is None:
        me = psutil.Process()
        token = f"{me.pid}-{secrets.token_hex(4)}"
        os.environ[SCOPE_ENV] = token
        env = {k: v for k, v in os.environ.items() if k != SCOPE_ENV}
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "support.reaper", str(me.pid), repr(me.create_time()), token],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to pytest's group must not reach it
        )
        lane = config.stash[_LANE] = Lane(token, watchdog)
    return lane


@contextlib.contextmanager
def _scoped(tag: str) -> Generator[None]:
    before = os.environ.get(SCOPE_ENV)
    os.environ[SCOPE_ENV] = tag
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SCOPE_ENV, None)
        else:
            os.environ[SCOPE_ENV] = before


def pytest_sessionstart(session: pytest.Session) -> None:
    """The lane from the start, in each process that runs tests: not in an xdist controller,
    whose workers would carry its token and be stopped as they shut down."""
    config = session.config
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    _lane(config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _lane(item.config)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    lane = _lane(request.config)
    tag = lane.scopes[id(fixturedef)] = lane.new_scope()
    with _scoped(tag):
        try:
            return (yield)
        except BaseException:
            lane.reap(tag, f"fixture {fixturedef.argname} (set-up failed)")
            raise


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> None:
    lane = request.config.stash.get(_LANE, None)
    tag = lane.scopes.pop(id(fixturedef), None) if lane is not None else None
    if lane is not None and tag is not None:
        lane.reap(tag, f"fixture {fixturedef.argname}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None]:
    lane = _lane(item.config)
    tag = lane.new_scope()
    try:
        with _scoped(tag):
            return (yield)
    finally:
        lane.reap(tag, item.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    lane = session.config.stash.get(_LANE, None)
    if lane is None or lane.finished:  # re-exported by more than one conftest
        return
    lane.finished = True
    lane.reap(lane.token, "the session")
    lane.watchdog.terminate()
    lane.watchdog.wait(timeout=10)


def reaped_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What had to be stopped: a test or a product teardown that left a process behind."""
    lane = terminalreporter.config.stash.get(_LANE, None)
    if lane is not None and lane.stopped:
        terminalreporter.section("processes the reaper stopped")
        for line in lane.stopped:
            terminalreporter.write_line(line)


def watch(pid: int, started: float, token: str, poll_s: float = 0.5) -> None:
    """Wait for the pytest process to end, however it ends, then stop what carries `token`."""
    while alive(pid, started):
        time.sleep(poll_s)
    reap(token)


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
