"""`regen` run as a user runs it: a subprocess with ephemeral Prefect, from a chosen directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.prefect import prefect_env


def regen_env(prefect_home: Path) -> dict[str, str]:
    """Ephemeral Prefect in `prefect_home`, no telemetry, no server URL, a patient first start."""
    return {**prefect_env(prefect_home), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}


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
