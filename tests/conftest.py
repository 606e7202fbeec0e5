"""Shared fixtures: a Prefect home per test worker, and the env a `regen` subprocess runs with."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A test that runs Prefect (a harness, a server, or `regen` in a subprocess with its own
# ephemeral server) is end to end: `make test-fast` leaves those out, `make test` runs all.
_E2E_FIXTURES = frozenset({"prefect_home", "prefect_harness", "stack", "cluster", "prefect"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ephemeral-Prefect home per xdist worker: its database is set up once, then reused."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.fixture
def regen_env(prefect_home: Path) -> dict[str, str]:
    """The environment of a `regen` subprocess: ephemeral Prefect, no telemetry, no server URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(prefect_home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="90",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_regen(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """`regen ARGS` as a user runs it, from `cwd`."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """An in-process Prefect test server, for tests that run flows here and read their states."""
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say, in one line, that the contract suite did not run and how to make it run."""
    from tests.contract._sglang import MISSING, env_ready, required

    if not env_ready() and not required():
        terminalreporter.write_line(MISSING)
