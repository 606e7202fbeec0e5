"""The trainers' suite needs .venv-trainers: skipped in one line without it, failed in CI.

Its data is a multi-turn thinking rehearsal in miniature (support.trainers): a real emulator
(Qwen3 reasoning parser, the bundled Qwen3-style model) answers conversations through regen's
dispatcher and the rows are committed as a dataset, once per module: `turns: all` (every answer
generated, some rows without a system message) and `turns: last` (a hand-written earlier answer
that came with the prompts).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from regen.storage import LocalStorage
from support.driver import required
from support.emulator import MODEL_DIR
from support.trainers import (
    NEEDS,
    Trainers,
    commit_rehearsal,
    conversations,
    env_ready,
    rehearsal_server,
    tool_conversations,
)

if not env_ready() and not required():
    # Nothing collected here; tests/conftest.py prints MISSING once in the summary.
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def trainers() -> Iterator[Trainers]:
    if not env_ready():
        pytest.fail(f"CI=true and {NEEDS}")
    driver = Trainers()
    yield driver
    driver.close()


@dataclass(frozen=True)
class Rehearsal:
    all_turns: LocalStorage
    """turns: all; rows 0-7 open with a system message, rows 8-11 do not."""
    last_turn: LocalStorage
    """turns: last; every row holds a hand-written assistant answer before its last question."""
    model: Path
    tools: LocalStorage
    """turns: all, with tools (support.trainers.tool_conversations)."""


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    root = tmp_path_factory.mktemp("rehearsal")
    with rehearsal_server(root / "logs") as endpoint:
        all_turns = commit_rehearsal(
            root / "all", endpoint, conversations(12, system_rows=8, hand_written=False), "all"
        )
        last_turn = commit_rehearsal(
            root / "last", endpoint, conversations(8, system_rows=8, hand_written=True), "last"
        )
        tools = commit_rehearsal(root / "tools", endpoint, tool_conversations(8), "all")
    yield Rehearsal(all_turns, last_turn, MODEL_DIR, tools)
