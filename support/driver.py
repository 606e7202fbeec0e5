"""A JSON-lines driver process in another venv: the one door the contract and trainers' tests
(and benches/trainers.py) use into code regen's own venv never imports (sglang, SpecForge,
speculators, torch)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def required() -> bool:
    """In CI a missing env is a failure: a judge must never pass by not running."""
    return os.environ.get("CI", "").lower() == "true"


class DriverError(Exception):
    """The driver's code raised: its exception, as text."""


class Driver:
    """The driver process, started once per test session; `ask` sends one op as a JSON line
    and returns the `result` of the answer line, or raises what the driver's code raised."""

    def __init__(self, python: Path, driver: Path, name: str) -> None:
        self._name = name
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen(
            [str(python), str(driver)],
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
            raise RuntimeError(f"the {self._name} driver died:\n{tail}")
        answer = json.loads(line)
        if "exception" in answer:
            raise DriverError(answer["exception"])
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
