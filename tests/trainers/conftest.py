"""The trainers' suite needs .venv-trainers: skipped in one line without it, failed in CI.

Its data is a multi-turn thinking rehearsal in miniature: a real emulator (Qwen3 reasoning
parser, the bundled Qwen3-style model) answers conversations through regen's dispatcher and
the rows are committed as a dataset, once per module: `turns: all` (every answer generated,
some rows without a system message) and `turns: last` (a hand-written earlier answer that came
with the prompts).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from pydantic import SecretStr

from regen.client import Dispatcher, DispatchTuning
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.dataset import commit_shard
from regen.schema import MESSAGE
from regen.sglang_api.endpoint import Endpoint
from regen.storage import LocalStorage
from support.emulator import MODEL_DIR, emulators
from tests.trainers._trainers import MISSING, Trainers, env_ready, required

if not env_ready() and not required():
    # Nothing collected here; tests/conftest.py prints MISSING once in the summary.
    collect_ignore_glob = ["test_*.py"]

MODEL = "qwen3-emu"
KEY = "test-key"
HAND_WRITTEN = "An earlier answer, written by hand, that came with the prompt."


@pytest.fixture(scope="session")
def trainers() -> Iterator[Trainers]:
    if not env_ready():
        pytest.fail(f"CI=true and {MISSING.removeprefix('trainers tests skipped: ')}")
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


def _conversations(count: int, *, system_every: int, hand_written: bool) -> pl.DataFrame:
    rows = []
    for i in range(count):
        messages = [{"role": "system", "content": "Answer briefly."}] if i < system_every else []
        messages.append({"role": "user", "content": f"question {i}: what is {i} + {i}?"})
        if hand_written:
            messages.append({"role": "assistant", "content": HAND_WRITTEN})
        messages.append({"role": "user", "content": "and why is that so?"})
        if not hand_written:
            messages.append({"role": "user", "content": "say it once more."})
        rows.append(messages)
    return pl.DataFrame(
        {"id": [f"c-{i:02d}" for i in range(count)], "messages": rows},
        schema={"id": pl.String, "messages": pl.List(MESSAGE)},
    )


def _commit(root: Path, endpoint: Endpoint, rows: pl.DataFrame, turns: str) -> LocalStorage:
    dispatcher = Dispatcher(
        [endpoint],
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=96),
        generation=GenerationConfig(),
        concurrency_per_server=4,
        regeneration=RegenerationConfig.model_validate({"turns": turns, "thinking": "save"}),
        tuning=DispatchTuning(retry_backoff_s=0.02, probe_backoff_s=0.2),
    )
    storage = LocalStorage(root)
    half = rows.height // 2
    with dispatcher:
        # Two shards, so every export writes (and a single file joins) more than one.
        for shard, part in enumerate((rows[:half], rows[half:])):
            out = dispatcher.submit_shard(shard, part).result(timeout=90)
            assert out["error"].null_count() == out.height, out["error"].to_list()
            commit_shard(storage, shard, out, fingerprint="rehearsal", timings={})
    plan = pl.DataFrame({"id": rows["id"], "shard": [int(i >= half) for i in range(rows.height)]})
    buffer = io.BytesIO()
    plan.write_parquet(buffer)
    storage.write_bytes("plan.parquet", buffer.getvalue())
    run = {"fingerprint": "rehearsal", "regeneration": {"thinking": "save", "turns": turns}}
    storage.write_bytes("run.json", json.dumps(run).encode())
    return storage


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    flags = [
        "--max-running-requests", "8", "--reasoning-parser", "qwen3", "--emu-load-s", "0",
        "--emu-tokens-per-s", "2000", "--emu-time-scale", "0.02",
        "--emu-reasoning-tokens", "5:30", "--emu-answer-tokens", "10:40",
    ]  # fmt: skip
    root = tmp_path_factory.mktemp("rehearsal")
    (root / "logs").mkdir()
    with emulators(root / "logs", [flags], served_name=MODEL, api_key=KEY) as (emu,):
        endpoint = Endpoint(0, emu.url)
        all_turns = _commit(
            root / "all", endpoint, _conversations(12, system_every=8, hand_written=False), "all"
        )
        last_turn = _commit(
            root / "last", endpoint, _conversations(8, system_every=8, hand_written=True), "last"
        )
    yield Rehearsal(all_turns, last_turn, MODEL_DIR)
