"""The contract tests' one door into the real sglang: a driver process in .venv-sglang.

regen's own venv never imports sglang (it drags in torch); the driver does, once per test
session, and answers one JSON line per check.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
DRIVER = Path(__file__).with_name("driver.py")
MISSING = "contract tests skipped: no .venv-sglang with sglang 0.5.23; build it: make contract-env"


def env_ready() -> bool:
    return SGLANG_PYTHON.exists()


def required() -> bool:
    """In CI a missing env is a failure: the contract must never pass by not running."""
    return os.environ.get("CI", "").lower() == "true"


class Sglang:
    """The driver process; `ask` sends one check and returns sglang's verdict."""

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen(
            [str(SGLANG_PYTHON), str(DRIVER)],
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
            raise RuntimeError(f"the sglang driver died:\n{tail}")
        answer = json.loads(line)
        if "exception" in answer:
            raise RuntimeError(f"driver: {answer['exception']}")
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
