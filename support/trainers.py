"""SpecForge 0.2.0 and speculators 0.9.0 as the judges of regen's exports, shared by
tests/trainers/ and benches/trainers.py: the driver process in .venv-trainers
(support/trainers_driver.py), the multi-turn thinking rehearsal whose exports they read, and
the row-by-row comparison of what they would train on with regen's own rows.

regen's own venv never imports the trainers (they drag in torch and transformers); the driver
does, once per session, and answers one JSON line per op.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from pydantic import SecretStr

from regen.client import Dispatcher, DispatchTuning
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.dataset import commit_shard
from regen.export.exporter import EXPORT_KEY
from regen.schema import MESSAGE
from regen.sglang_api.endpoint import Endpoint
from regen.storage import LocalStorage
from support.driver import REPO, Driver, DriverError
from support.emulator import emulators

TRAINERS_PYTHON = REPO / ".venv-trainers" / "bin" / "python"
DRIVER = Path(__file__).with_name("trainers_driver.py")
NEEDS = "no .venv-trainers with specforge 0.2.0 and speculators 0.9.0; build it: make trainers-env"
MISSING = f"trainers tests skipped: {NEEDS}"

MODEL = "qwen3-emu"
KEY = "test-key"
HAND_WRITTEN = "An earlier answer, written by hand, that came with the prompt."
TEMPLATE = "qwen3-thinking"
"""SpecForge's template for a thinking Qwen3: the only one that keeps reasoning_content."""
SPECFORGE_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
"""What that template puts before a conversation that has no system message."""

Row = tuple[tuple[int, ...], tuple[int, ...]]
"""A training row as (input_ids, loss_mask): the trainers shuffle and drop `id`, so rows are
matched by their tokens."""


def env_ready() -> bool:
    return TRAINERS_PYTHON.exists()


TrainerError = DriverError


class Trainers(Driver):
    """The driver process in its venv (support.driver): `ask` runs one op there."""

    def __init__(self) -> None:
        super().__init__(TRAINERS_PYTHON, DRIVER, "trainers'")


def conversations(count: int, *, system_rows: int, hand_written: bool) -> pl.DataFrame:
    """`count` conversations, the first `system_rows` opening with a system message. Without
    `hand_written` each asks three questions, all answered by the model (`turns: all`); with
    it, one earlier answer came with the prompt and only the last is generated (`turns: last`)."""
    rows = []
    for i in range(count):
        messages = [{"role": "system", "content": "Answer briefly."}] if i < system_rows else []
        messages.append({"role": "user", "content": f"question {i}: what is {i} + {i}?"})
        if hand_written:
            messages.append({"role": "assistant", "content": HAND_WRITTEN})
        messages.append({"role": "user", "content": "and why is that so?"})
        if not hand_written:
            messages.append({"role": "user", "content": "say it once more."})
        rows.append(messages)
    return pl.DataFrame(
        {"id": [f"c-{i:03d}" for i in range(count)], "messages": rows},
        schema={"id": pl.String, "messages": pl.List(MESSAGE)},
    )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
"""The tool of the tool-call rehearsal; the emulated model calls it with city "ten"."""


def tool_conversations(count: int) -> pl.DataFrame:
    """`count` conversations with `tools`: a question, the given call of get_weather and its
    result, the given answer, then a second question. The even rows' given call is the one
    the model makes (its result is kept and the model goes on, and calls again on the second
    question, which the given conversation has no result for); the odd rows' is another, so
    the conversation stops at the model's first call (regen.tools)."""
    rows, tools = [], []
    for i in range(count):
        city = "ten" if i % 2 == 0 else "nine"
        function = {"name": "get_weather", "arguments": json.dumps({"city": city})}
        call = {"id": f"given-{i}", "type": "function", "function": function}
        rows.append(
            [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": f"question {i}: the weather in ten?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": '{"temp": 20}', "tool_call_id": f"given-{i}"},
                {"role": "user", "content": "and why is that so?"},
            ]
        )
        tools.append(json.dumps([WEATHER]))
    return pl.DataFrame(
        {"id": [f"t-{i:03d}" for i in range(count)], "messages": rows, "tools": tools},
        schema={"id": pl.String, "messages": pl.List(MESSAGE), "tools": pl.String},
    )


@contextmanager
def rehearsal_server(logs: Path) -> Iterator[Endpoint]:
    """One real emulator with Qwen3's reasoning and tool-call parsers and the bundled
    Qwen3-style model, answering in milliseconds."""
    flags = [
        "--max-running-requests", "8", "--reasoning-parser", "qwen3", "--emu-load-s", "0",
        "--tool-call-parser", "qwen25",
        "--emu-tokens-per-s", "2000", "--emu-time-scale", "0.02",
        "--emu-reasoning-tokens", "5:30", "--emu-answer-tokens", "10:40",
    ]  # fmt: skip
    logs.mkdir(parents=True, exist_ok=True)
    with emulators(logs, [flags], served_name=MODEL, api_key=KEY) as (emu,):
        yield Endpoint(0, emu.url)


def commit_rehearsal(
    root: Path, endpoint: Endpoint, rows: pl.DataFrame, turns: str
) -> LocalStorage:
    """`rows` answered through regen's dispatcher (thinking saved) and committed as a dataset
    at `root` in two shards, so every export writes (and a single file joins) more than one."""
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
        for shard, part in enumerate((rows[:half], rows[half:])):
            out = dispatcher.submit_shard(shard, part).result(timeout=90)
            if out["error"].null_count() != out.height:
                raise RuntimeError(f"the rehearsal's rows failed: {out['error'].to_list()}")
            commit_shard(storage, shard, out, fingerprint="rehearsal", timings={})
    plan = pl.DataFrame({"id": rows["id"], "shard": [int(i >= half) for i in range(rows.height)]})
    buffer = io.BytesIO()
    plan.write_parquet(buffer)
    storage.write_bytes("plan.parquet", buffer.getvalue())
    run = {"fingerprint": "rehearsal", "regeneration": {"thinking": "save", "turns": turns}}
    storage.write_bytes("run.json", json.dumps(run).encode())
    return storage


def regen_rows(dest: Path) -> list[Row]:
    """A JSONL token export's rows, as written (every file its record lists)."""
    record = json.loads((dest / EXPORT_KEY).read_text())
    rows = []
    for name in record["files"]:
        for line in (dest / name).read_text().splitlines():
            row = json.loads(line)
            rows.append((tuple(row["input_ids"]), tuple(row["loss_mask"])))
    return rows


def as_rows(answer: list[dict[str, list[int]]]) -> list[Row]:
    """A driver's rows as comparable tuples."""
    return [(tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in answer]


def without_prefix(rows: list[Row], prefix: tuple[int, ...]) -> tuple[list[Row], list[Row]]:
    """(every row, `prefix` cut off where it starts with it; the rows that did, whole):
    SpecForge's own system prompt on a conversation that had none is tokens the server never
    saw, named apart from the comparison."""
    n = len(prefix)
    prefixed = [r for r in rows if r[0][:n] == prefix]
    cut = [(ids[n:], mask[n:]) if ids[:n] == prefix else (ids, mask) for ids, mask in rows]
    return cut, prefixed


@dataclass
class Comparison:
    """What a trainer read, against regen's rows: each of its rows is equal to one of regen's,
    or equal but for one trailing newline token it trains (SpecForge renders the
    conversation and ends the last turn with "<|im_end|>\\n"; the server stops at <|im_end|>),
    or different; `unmatched` counts regen's rows the trainer never produced."""

    accepted: int = 0
    equal: int = 0
    newline_only: int = 0
    other: list[str] = field(default_factory=list)
    unmatched: int = 0

    def line(self, name: str) -> str:
        return (
            f"trainers: {name}: accepted {self.accepted}, equal {self.equal}, "
            f"newline-only {self.newline_only}, other {len(self.other)}, "
            f"never reached {self.unmatched}"
        )


def compare(theirs: list[Row], ours: list[Row], newline: int | None = None) -> Comparison:
    """Match every trainer row to one of regen's (each used once): exactly, or (with
    `newline`, the token id of "\\n") followed by a trained newline token."""
    left = {ids: mask for ids, mask in ours}
    if len(left) != len(ours):
        raise ValueError("regen's rows are not distinct: a row could be matched twice")
    result = Comparison(accepted=len(theirs))
    for ids, mask in theirs:
        if left.get(ids) == mask:
            result.equal += 1
            del left[ids]
        elif newline is not None and ids and ids[-1] == newline and left.get(ids[:-1]) == mask[:-1]:
            if mask[-1] != 1:
                result.other.append(f"{len(ids)} tokens: the trailing newline is not trained")
            else:
                result.newline_only += 1
            del left[ids[:-1]]
        else:
            result.other.append(f"{len(ids)} tokens: matches none of regen's rows")
    result.unmatched = len(left)
    return result
