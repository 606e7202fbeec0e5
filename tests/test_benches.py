"""Every bench runs at its smoke size and writes its JSON, so a change that breaks one fails here.

Figures are not asserted (a smoke size measures nothing); what is checked is that the bench
ran to the end and wrote its result, marked as a smoke run, where the test told it to. The
benches that run flows share this worker's ephemeral Prefect home, set up once per session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

pytestmark = pytest.mark.timeout(600)  # marked bench in conftest.py

BENCHES = sorted(p.stem for p in (REPO / "benches").glob("[!_]*.py"))
# Benches that run `regen rehearse` themselves take the Prefect home they are given.
TAKES_PREFECT_HOME = {"chaos", "scale", "vs_ideal"}


def test_every_bench_is_listed() -> None:
    assert {"audit", "chaos", "dispatch", "scale"} <= set(BENCHES), BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_bench_smoke(name: str, tmp_path: Path, regen_env: dict[str, str]) -> None:
    env = {**regen_env, "REGEN_BENCH_RESULTS": str(tmp_path)}
    args = [sys.executable, str(REPO / "benches" / f"{name}.py"), "--smoke"]
    if name in TAKES_PREFECT_HOME:
        args += ["--prefect-home", env["PREFECT_HOME"]]
    done = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540, check=False
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads((tmp_path / f"{name}.json").read_text())
    assert _smoke_marked(result), f"{name}.json is not marked as a smoke run"


def _smoke_marked(result: object) -> bool:
    """`"smoke": true` at the top, in a `setup` or `args` section, or in every list item."""
    if isinstance(result, list):
        return bool(result) and all(_smoke_marked(r) for r in result)
    if not isinstance(result, dict):
        return False
    sections = [result, result.get("setup"), result.get("args")]
    return any(isinstance(s, dict) and s.get("smoke") in (True, "True") for s in sections)
