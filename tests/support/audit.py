"""Synthetic datasets for the audit tests: clean rows plus defects planted at known rates.

Every row is a real row of `row_schema()` in a real shard file with its manifest, and
the dataset has plan.parquet and run.json, so the audit reads exactly what a run writes.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from regen.dataset import REJECTS_KEY, commit_shard, data_key
from regen.prompts import REJECTS_SCHEMA
from regen.schema import row_schema
from regen.storage import LocalStorage
from tests.support.lossmask import qwen3_model_dir

PROMPT_MARK = "PROMPT-SECRET"
LOOP = "Wait, let me check that again. "
COLLAPSED = "The final answer is 42, as the reasoning above shows."
ERROR = "http 500 after 4 attempts"
FINGERPRINT = "synthetic-run"
SWITCHED = "答案是四十二，因为上面的推理过程表明了这一点。"

DEFECTS = (
    "error",
    "empty",
    "filler",
    "short",
    "empty_thinking",
    "think_leak",
    "unbalanced",
    "truncated",
    "truncated_in_thinking",
    "repetition",
    "collapse",
    "tiny_reasoning",
    "incident",
    "language_switch",
    "aborted",
)


@dataclass
class Synthetic:
    """A dataset on disk and the ids of every planted defect."""

    root: Path
    storage: LocalStorage
    ids: list[str]
    planted: dict[str, list[str]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unplanned: list[str] = field(default_factory=list)

    def ids_of(self, *defects: str) -> set[str]:
        return {i for d in defects for i in self.planted.get(d, [])}

    @property
    def completions(self) -> int:
        """Rows the quality checks look at: present, not error rows."""
        rows = len(self.ids) - len(self.dropped) + len(self.duplicated) + len(self.unplanned)
        return rows - len(self.planted.get("error", []))


def _words(rng: random.Random, vocab: list[str], lo: int, hi: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(lo, hi)))


def _clean_row(i: int, shard: int, server: str, rng: random.Random, vocab: list[str]) -> dict:
    reasoning = _words(rng, vocab, 40, 80)
    content = _words(rng, vocab, 20, 40)
    r, a = len(reasoning.split()), len(content.split())
    ident = f"s{i:06d}"
    return {
        "id": ident,
        "shard": shard,
        "messages": [{"role": "user", "content": f"{PROMPT_MARK} question {ident}"}],
        "content": content,
        "reasoning_content": reasoning,
        "finish_reason": "stop",
        "prompt_tokens": rng.randint(30, 300),
        "completion_tokens": r + a,
        "reasoning_tokens": r,
        "model": "synthetic",
        "server": server,
        "attempts": 1,
        "latency_s": 1.5,
        "error": None,
    }


def _plant(row: dict[str, Any], defect: str) -> None:
    r = row["reasoning_tokens"]
    if defect == "error":
        row.update(content=None, reasoning_content=None, finish_reason=None, error=ERROR)
        row.update(completion_tokens=None, reasoning_tokens=None)
    elif defect == "empty":
        row.update(content="", completion_tokens=r)
    elif defect == "filler":
        row.update(content="OK.", completion_tokens=r + 2)
    elif defect == "short":
        row.update(content="Yes it is", completion_tokens=r + 3)
    elif defect == "empty_thinking":
        a = row["completion_tokens"] - r
        row.update(reasoning_content="", reasoning_tokens=0, completion_tokens=a)
    elif defect == "think_leak":
        row.update(content="</think> " + row["content"])
    elif defect == "unbalanced":
        row.update(reasoning_content="<think> " + row["reasoning_content"])
    elif defect == "truncated":
        row.update(finish_reason="length")
    elif defect == "truncated_in_thinking":
        row.update(finish_reason="length", content="", completion_tokens=r)
    elif defect == "repetition":
        loop = LOOP * 12
        n = len(loop.split())
        a = row["completion_tokens"] - r
        row.update(reasoning_content=loop, reasoning_tokens=n, completion_tokens=n + a)
    elif defect == "collapse":
        a = len(COLLAPSED.split())
        row.update(content=COLLAPSED, completion_tokens=r + a)
    elif defect == "tiny_reasoning":
        a = row["completion_tokens"] - r
        row.update(reasoning_content="Easy.", reasoning_tokens=2, completion_tokens=a + 2)
    elif defect == "incident":
        row.update(content="OK.", reasoning_content="", reasoning_tokens=3, completion_tokens=6)
    elif defect == "language_switch":
        row.update(content=SWITCHED)
    elif defect == "aborted":  # cut mid-answer, stored as if it were one
        row.update(finish_reason="abort", content=" ".join(row["content"].split()[:3]))
    else:
        raise ValueError(defect)


def make_dataset(
    root: Path,
    *,
    rows: int = 2000,
    shard_size: int = 500,
    servers: int = 4,
    defects: Mapping[str, float] | None = None,
    seed: int = 0,
    thinking: str | None = "save",
    bad_server: int | None = None,
    drop: int = 0,
    duplicate: int = 0,
    unplanned: int = 0,
    uncommitted: Sequence[int] = (),
    plan: bool = True,
) -> Synthetic:
    """Write a dataset under `root`; each defect hits round(rate * rows) disjoint rows.

    `bad_server` empties every answer of that server (rows go to servers round-robin);
    `drop` rows vanish, `duplicate` rows appear twice, `unplanned` extra ids are added,
    and the shards in `uncommitted` keep their data but get no manifest.
    """
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(3000)
    ]
    data = [
        _clean_row(i, i // shard_size, f"server-{i % servers}", rng, vocab) for i in range(rows)
    ]
    storage = LocalStorage(root)
    ds = Synthetic(root=root, storage=storage, ids=[r["id"] for r in data])
    order = list(range(rows))
    rng.shuffle(order)
    at = 0
    for defect, rate in (defects or {}).items():
        count = round(rate * rows)
        chosen = sorted(order[at : at + count])
        at += count
        for i in chosen:
            _plant(data[i], defect)
        ds.planted[defect] = [data[i]["id"] for i in chosen]
    if bad_server is not None:
        hit = [r for r in data if r["server"] == f"server-{bad_server}" and r["error"] is None]
        for r in hit:
            _plant(r, "empty")
        ds.planted["bad_server"] = [r["id"] for r in hit]
    plan_df = pl.DataFrame({"id": ds.ids, "shard": [r["shard"] for r in data]})
    rest = order[at:]
    ds.dropped = sorted(data[i]["id"] for i in rest[:drop])
    ds.duplicated = sorted(data[i]["id"] for i in rest[drop : drop + duplicate])
    out = [r for r in data if r["id"] not in set(ds.dropped)]
    out += [dict(r) for r in data if r["id"] in set(ds.duplicated)]
    for k in range(unplanned):
        extra = _clean_row(rows + k, (rows - 1) // shard_size, "server-0", rng, vocab)
        extra["id"] = f"x{k:06d}"
        out.append(extra)
        ds.unplanned.append(extra["id"])
    frame = pl.DataFrame(out, schema=row_schema())
    # A duplicate goes to the next shard: a shard itself refuses an id twice (regen.dataset).
    dup_shift = (
        pl.col("id").is_in(ds.duplicated)
        & pl.col("id").is_duplicated()
        & pl.col("id").is_last_distinct()
    )
    last = (rows - 1) // shard_size
    neighbour = pl.when(pl.col("shard") < last).then(pl.col("shard") + 1).otherwise(last - 1)
    frame = frame.with_columns(shard=pl.when(dup_shift).then(neighbour).otherwise("shard")).sort(
        "shard", maintain_order=True
    )
    for (shard,), part in frame.group_by("shard", maintain_order=True):
        if shard in uncommitted:
            _write_parquet(storage, data_key(shard), part)
        else:
            commit_shard(storage, shard, part, fingerprint=FINGERPRINT, timings={})
    if plan:
        _write_parquet(storage, "plan.parquet", plan_df)
    # As a plan writes it: no input row was rejected.
    _write_parquet(storage, REJECTS_KEY, pl.DataFrame(schema=REJECTS_SCHEMA))
    run: dict[str, Any] = {"model": "synthetic", "fingerprint": FINGERPRINT}
    if thinking is not None:
        run["regeneration"] = {"thinking": thinking}
    storage.write_bytes("run.json", json.dumps(run).encode())
    return ds


def _write_parquet(storage: LocalStorage, key: str, frame: pl.DataFrame) -> None:
    buf = io.BytesIO()
    frame.write_parquet(buf)
    storage.write_bytes(key, buf.getvalue())


def tiny_tokenizer(path: Path) -> Path:
    """A model directory with a WordLevel tokenizer (one token per word, per newline run and
    per special token) and a Qwen3 chat template, so the loss mask of the answer
    `<think>\\n\\n</think>\\n\\nOK.<|im_end|>` is exactly 6 tokens."""
    return qwen3_model_dir(path)
