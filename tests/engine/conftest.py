"""The engine lane needs .venv-sglang that serves on a CPU: skipped in one line without it,
failed in CI (`make engine-env` builds it).

Every process a test here starts is stopped when the fixture or test that started it ends,
a timeout included (support/reaper.py, whose hooks are re-exported below); each test has one
budget, TEST_TIMEOUT_S on pytest-timeout's signal method, whose alarm unwinds through the
finalizers; and the lane's `regen` subprocesses share one Prefect server (`regen_env`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.machine.ports import quiet_port_range
from support.engine import (
    HANG_GUARD_S,
    MISSING,
    SERVER_ARGS,
    TEST_TIMEOUT_S,
    build_tiny_model,
    engine_config,
    env_ready,
    required,
    write_prompts,
)
from support.prefect import Server, prefect_server
from support.reaper import pytest_fixture_post_finalizer as pytest_fixture_post_finalizer
from support.reaper import pytest_fixture_setup as pytest_fixture_setup
from support.reaper import pytest_runtest_call as pytest_runtest_call
from support.reaper import pytest_runtest_setup as pytest_runtest_setup
from support.reaper import pytest_sessionfinish as pytest_sessionfinish
from tests.engine.live import LiveRun, running

if not env_ready() and not required():
    # Nothing collected here; tests/conftest.py prints MISSING once in the summary.
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/engine/" in str(item.path):
            item.add_marker(pytest.mark.engine)
            # Appended: a test's own timeout mark, if it has one, is the closer one.
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S, method="signal"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Qwen3 (support/tiny_model.py) over the bundled tokenizer."""
    if not env_ready():
        pytest.fail(f"CI=true and {MISSING.removeprefix('engine tests skipped: ')}")
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def lane_prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `prefect server` for the lane: each `regen` subprocess would otherwise start (and
    set up the database of) a temporary one, ~20 s a run on this machine."""
    with prefect_server(tmp_path_factory.mktemp("lane-prefect"), startup_timeout=240) as server:
        yield server


@pytest.fixture(scope="session")
def one_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> Iterator[tuple[str, str]]:
    """One real server launched by regen's own fleet code, with its own key and the tool-call
    parser (engine.tool_call_parser), for the tests that send it requests themselves (an
    abort, tools, a wrong key): one start for all of them, a start being a minute or two of
    the lane; between them it sleeps (SERVER_ARGS). (url, key)."""
    from regen.config import parse_config
    from regen.fleet import build_server_commands, generate_api_key, launch_fleet

    tmp = tmp_path_factory.mktemp("one-server")
    config = parse_config(
        engine_config(tmp, tiny_model, tmp / "none.jsonl", quiet_port_range(1),
                      engine={"servers": 1, "tool_call_parser": "qwen25"}),
        "server",
    )  # fmt: skip
    key = generate_api_key()
    commands = build_server_commands(config, tiny_model, key, tmp / "server-work")
    assert "--tool-call-parser" in commands[0].argv
    with launch_fleet(config, commands, key) as fleet:
        yield fleet.endpoints[0].url, key.get_secret_value()


@pytest.fixture
def regen_env(lane_prefect: Server) -> dict[str, str]:
    """The environment of a `regen` subprocess here: the lane's Prefect server, no telemetry;
    taken now, so what the test starts carries its scope (support/reaper.py)."""
    return lane_prefect.env_now()


@pytest.fixture
def two_server_run(
    tmp_path: Path, tiny_model: Path, regen_env: dict[str, str]
) -> Iterator[LiveRun]:
    """`regen run` on two real CPU servers over 120 one-turn prompts (6 shards, two requests
    a server), handed over generating once a shard has committed: `server_pids()` are its
    launchers, `kill_server(port)` crashes one, `wait()` waits for the run's end. Whatever is
    left, a relaunched server included, is stopped on the way out (tests/engine/live.py).

    A crashed server is relaunched after a second's backoff. A test may hold a server stopped
    (`kill_server(port, SIGSTOP)`) for as long as another takes to come back: its requests
    then wait, so the request timeout, the supervisor's hang_s and SGLang's own watchdog (300 s
    without a forward step kills the server) are hang guards here, as long as the test."""
    write_prompts(tmp_path / "prompts.jsonl", single=120, multi=0, too_long=0)
    config = engine_config(
        tmp_path, tiny_model, tmp_path / "prompts.jsonl", quiet_port_range(2),
        engine={"relaunch": {"backoff_s": 1.0, "hang_s": HANG_GUARD_S},
                "extra_args": [*SERVER_ARGS, "--watchdog-timeout", str(HANG_GUARD_S)]},
        generation={"request_timeout_s": HANG_GUARD_S},
    )  # fmt: skip
    config["concurrency_per_server"] = 2
    with running(tmp_path, config, regen_env) as run:
        yield run
