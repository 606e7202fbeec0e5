"""Shared fixtures (a Prefect home per test worker, the env of a `regen` subprocess, the moto S3
server) and the one place that marks tests: e2e by the fixtures that start Prefect, bench and
slow by module or directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support.reaper import pytest_sessionfinish as pytest_sessionfinish
from support.reaper import pytest_sessionstart as pytest_sessionstart
from support.reaper import reaped_summary
from tests.support.cli import regen_env as _regen_env

if TYPE_CHECKING:
    from support.s3 import MotoS3

# A test that runs Prefect (a harness, a `prefect server`, or `regen` in a subprocess with its
# own ephemeral server) is end to end: `make test-fast` leaves those out, `make test` runs all.
# Each way has its fixture below; item.fixturenames is the whole closure, so a module's fixture
# built on one of them (a deployment stack, a cluster) makes its tests e2e too.
_E2E_FIXTURES = frozenset({"prefect_home", "prefect_harness", "prefect_server_home"})
# Modules whose every test runs a bench at its smoke size.
_BENCH_MODULES = frozenset({"test_benches.py"})
# Slow by nature, not by waste: seconds of another venv's imports (SGLang's, the trainers'
# torch), fleets of servers killed, stopped and relaunched, pytest sessions run out to their
# timeouts. `make test-fast` leaves them to `make test`; a test slow for a reason of its own
# carries the mark itself.
_SLOW_DIRS = frozenset({"contract", "trainers"})
_SLOW_MODULES = frozenset({"test_supervisor.py", "test_reaper.py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
        if item.path.name in _BENCH_MODULES:
            item.add_marker(pytest.mark.bench)
        if item.path.name in _SLOW_MODULES or item.path.parent.name in _SLOW_DIRS:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which returns its LoadGroupScheduling
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadgroup`, the tests that share a set-up go to one worker
    (tests/support/groups.py: the marks xdist reads are lost under pytest 9.2)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.support.groups import SharedSetupScheduling

    return SharedSetupScheduling(config, log)


@pytest.fixture(scope="session")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ephemeral-Prefect home per xdist worker: its database is set up once, then reused."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.fixture(scope="module")
def prefect_server_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PREFECT_HOME of a `prefect server` a test starts (support.prefect.prefect_server)."""
    return tmp_path_factory.mktemp("prefect-server")


@pytest.fixture
def regen_env(prefect_home: Path) -> dict[str, str]:
    """The environment of a `regen` subprocess: ephemeral Prefect, no telemetry, no server URL."""
    return _regen_env(prefect_home)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One moto S3 server per test worker; each test makes its own bucket (`create_bucket`)."""
    from support.s3 import moto_server  # moto costs a second to import: only where used

    with moto_server() as server:
        yield server


@pytest.fixture
def moto(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """The worker's moto server, its credentials and endpoint in this test's environment (for
    code on the default credential chain); a test that stops it for an outage restarts it."""
    for key, value in moto_s3.env.items():
        monkeypatch.setenv(key, value)
    return moto_s3


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """An in-process Prefect test server, for tests that run flows here and read their states."""
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say, in one line each, that the contract, engine or trainers suite did not run and how
    to make it run."""
    from support import engine, trainers
    from support.driver import required
    from tests.contract import _sglang

    for suite in (_sglang, engine, trainers):
        if not suite.env_ready() and not required():
            terminalreporter.write_line(suite.MISSING)
    reaped_summary(terminalreporter)
