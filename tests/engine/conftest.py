"""The engine lane needs .venv-sglang that serves on a CPU: skipped in one line without it,
failed in CI (`make engine-env` builds it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.engine import MISSING, build_tiny_model, env_ready, required

if not env_ready() and not required():
    # Nothing collected here; tests/conftest.py prints MISSING once in the summary.
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/engine/" in str(item.path):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Qwen3 (support/tiny_model.py) over the bundled tokenizer."""
    if not env_ready():
        pytest.fail(f"CI=true and {MISSING.removeprefix('engine tests skipped: ')}")
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
