"""The trainers' tests' one door into SpecForge and speculators: a driver process in
.venv-trainers.

regen's own venv never imports the trainers (they drag in torch and transformers); the driver
does, once per test session, and answers one JSON line per check.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TRAINERS_PYTHON = REPO / ".venv-trainers" / "bin" / "python"
DRIVER = Path(__file__).with_name("driver.py")
MISSING = (
    "trainers tests skipped: no .venv-trainers with specforge 0.2.0 and speculators 0.9.0; "
    "build it: make trainers-env"
)


def env_ready() -> bool:
    return TRAINERS_PYTHON.exists()


def required() -> bool:
    """In CI a missing env is a failure: the trainers must never pass by not running."""
    return os.environ.get("CI", "").lower() == "true"


class TrainerError(Exception):
    """A trainer refused the input: the exception its own code raised, as text."""


class Trainers:
    """The driver process; `ask` runs one trainer path and returns what it would train on."""

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen(
            [str(TRAINERS_PYTHON), str(DRIVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=REPO,
        )

    def ask(self, op: str, **fields: Any) -> Any:
        assert self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read().decode("utf-8", "replace")[-3000:]
            raise RuntimeError(f"the trainers' driver died:\n{tail}")
        answer = json.loads(line)
        if "exception" in answer:
            raise TrainerError(answer["exception"])
        return answer["result"]

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()
