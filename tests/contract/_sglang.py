"""The contract tests' one door into the real sglang: a driver process in .venv-sglang.

regen's own venv never imports sglang (it drags in torch); the driver does, once per test
session, and answers one JSON line per check.
"""

from __future__ import annotations

from pathlib import Path

from support.driver import REPO, Driver, required

__all__ = ["MISSING", "Sglang", "env_ready", "required"]

SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
DRIVER = Path(__file__).with_name("driver.py")
MISSING = "contract tests skipped: no .venv-sglang with sglang 0.5.23; build it: make contract-env"


def env_ready() -> bool:
    return SGLANG_PYTHON.exists()


class Sglang(Driver):
    """The driver process in its venv (support.driver): `ask` runs one op there."""

    def __init__(self) -> None:
        super().__init__(SGLANG_PYTHON, DRIVER, "sglang")
