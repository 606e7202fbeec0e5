"""The tests that share a set-up run on one xdist worker (tests/support/groups.py): checked by
running pytest itself with `make test`'s flags on a throwaway suite, so a pytest or xdist
upgrade that bypasses the scheduler fails here instead of doubling set-ups unseen."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support import REPO
from tests.support.groups import _BY_DIR, _BY_MODULE, group_of


def test_every_grouped_module_and_directory_exists() -> None:
    tests = REPO / "tests"
    assert {p.name for p in tests.rglob("test_*.py")} >= _BY_MODULE
    assert all((tests / name).is_dir() for name in _BY_DIR)


def test_group_of_names_a_module_a_directory_or_nothing() -> None:
    assert group_of("tests/test_flow.py::test_a[x]") == "tests/test_flow.py"
    assert group_of("tests/contract/test_contract_argv.py::test_b") == "sglang"
    assert group_of("tests/test_config.py::test_c") is None


def test_a_grouped_module_runs_on_one_worker_while_the_other_works_on(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n"
    )
    body = "import pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_t(i):\n    pass\n"
    (tmp_path / "test_flow.py").write_text(body)  # grouped by name
    (tmp_path / "test_loose.py").write_text(body)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for worker, module in re.findall(r"\[(gw\d)\][^\n]*PASSED (test_\w+)\.py", done.stdout):
        workers.setdefault(module, set()).add(worker)
    assert workers.get("test_flow") is not None and len(workers["test_flow"]) == 1, done.stdout
    assert set().union(*workers.values()) == {"gw0", "gw1"}, done.stdout
