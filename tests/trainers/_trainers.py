"""The trainers' tests' one door into SpecForge and speculators: a driver process in
.venv-trainers.

regen's own venv never imports the trainers (they drag in torch and transformers); the driver
does, once per test session, and answers one JSON line per check.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.driver import REPO, Driver, DriverError, required

__all__ = ["MISSING", "TrainerError", "Trainers", "env_ready", "required"]

TRAINERS_PYTHON = REPO / ".venv-trainers" / "bin" / "python"
DRIVER = Path(__file__).with_name("driver.py")
MISSING = (
    "trainers tests skipped: no .venv-trainers with specforge 0.2.0 and speculators 0.9.0; "
    "build it: make trainers-env"
)


def env_ready() -> bool:
    return TRAINERS_PYTHON.exists()


TrainerError = DriverError


class Trainers(Driver):
    """The driver process in its venv (tests.support.driver): `ask` runs one op there."""

    def __init__(self) -> None:
        super().__init__(TRAINERS_PYTHON, DRIVER, "trainers'")
