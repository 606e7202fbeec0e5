"""Datasets with the server's token ids, for the export tests and bench: real shard files
with manifests, plan.parquet and run.json, rows shaped as SGLang's Qwen3 parser leaves them
(`content` starting "\\n\\n", `reasoning_content` ending "\\n")."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from regen.dataset import commit_shard
from regen.schema import OUTPUT_MESSAGE, TURN, row_schema
from regen.storage import LocalStorage, Storage

FINGERPRINT = "export-synthetic"


def user_text(row_id: str, turn: int) -> str:
    """A user turn with quotes, non-ASCII and what a null reasoning encodes to, verbatim."""
    return f'q{turn} é "{row_id}" ,"reasoning_content":null}}'


def synthetic_shard(
    shard: int,
    start: int,
    n: int,
    rng: np.random.Generator,
    *,
    turns: int = 1,
    prompt_tokens: int = 40,
    response_tokens: int = 60,
    error_every: int = 0,
    truncated_every: int = 0,
    no_ids_every: int = 0,
) -> pl.DataFrame:
    """`n` rows of `turns` regenerated turns each (turns: all when > 1); every k-th row is an
    error / truncated / without ids when its `*_every` is k."""
    ids = [f"r{start + i:07d}" for i in range(n)]
    total = n * turns
    p_len = rng.integers(prompt_tokens // 2, prompt_tokens * 3 // 2 + 1, total)
    r_len = rng.integers(1, response_tokens * 2, total)
    pool = rng.integers(0, 150_000, int(p_len.max() + r_len.max()) + 1000, dtype=np.int32)
    offsets = rng.integers(0, 1000, total)
    prompt_ids = [pool[o : o + k].tolist() for o, k in zip(offsets, p_len, strict=True)]
    response_ids = [pool[o : o + k].tolist() for o, k in zip(offsets, r_len, strict=True)]
    records = []
    for i in range(n):
        row_turns: list[dict[str, Any]] = []
        messages: list[dict[str, str | None]] = [
            {"role": "system", "content": "be brief", "reasoning_content": None}
        ]
        for t in range(turns):
            k = i * turns + t
            truncated = truncated_every and (start + i) % truncated_every == 0 and t == turns - 1
            has_ids = not (no_ids_every and (start + i) % no_ids_every == 0)
            row_turns.append(
                {
                    "turn": t + 1,
                    "finish_reason": "length" if truncated else "stop",
                    "prompt_tokens": int(p_len[k]),
                    "completion_tokens": int(r_len[k]),
                    "reasoning_tokens": int(r_len[k]) // 2,
                    "reasoning_effort": None,
                    "server": "server-0",
                    "attempts": 1,
                    "latency_s": 0.5,
                    "prompt_token_ids": prompt_ids[k] if has_ids else None,
                    "response_token_ids": response_ids[k] if has_ids else None,
                }
            )
            messages.append(
                {"role": "user", "content": user_text(ids[i], t), "reasoning_content": None}
            )
            messages.append(
                {
                    "role": "assistant",
                    "content": f"\n\nanswer {t} of {ids[i]}",
                    "reasoning_content": f"thinking {t}\n",
                }
            )
        last = messages[-1]
        if turns == 1:
            messages = messages[:-1]  # turns: last stores the answer in `content` only
        error = error_every and (start + i) % error_every == 0
        records.append(
            {
                "id": ids[i],
                "shard": shard,
                "messages": messages,
                "content": None if error else last["content"],
                "reasoning_content": None if error else last["reasoning_content"],
                "finish_reason": None if error else row_turns[-1]["finish_reason"],
                "prompt_tokens": sum(t["prompt_tokens"] for t in row_turns),
                "completion_tokens": sum(t["completion_tokens"] for t in row_turns),
                "reasoning_tokens": sum(t["reasoning_tokens"] for t in row_turns),
                "model": "synthetic",
                "server": "server-0",
                "attempts": turns,
                "latency_s": 0.5 * turns,
                "error": "http 500 after 4 attempts" if error else None,
                "turns": [] if error else row_turns,
            }
        )
    schema = row_schema()
    assert schema["messages"] == pl.List(OUTPUT_MESSAGE) and schema["turns"] == pl.List(TURN)
    return pl.DataFrame(records, schema=schema)


def make_export_dataset(
    root: Path | str | Storage,
    *,
    rows: int = 40,
    shard_size: int = 10,
    seed: int = 0,
    **kwargs: object,
) -> Storage:
    """Commit `rows` synthetic rows in shards of `shard_size`, with plan.parquet and run.json."""
    storage = root if isinstance(root, Storage) else LocalStorage(Path(root))
    rng = np.random.default_rng(seed)
    ids = [f"r{i:07d}" for i in range(rows)]
    plan = pl.DataFrame({"id": ids, "shard": [i // shard_size for i in range(rows)]})
    import io

    buffer = io.BytesIO()
    plan.write_parquet(buffer)
    storage.write_bytes("plan.parquet", buffer.getvalue())
    run = {"fingerprint": FINGERPRINT, "regeneration": {"thinking": "save"}}
    storage.write_bytes("run.json", json.dumps(run).encode())
    for shard, start in enumerate(range(0, rows, shard_size)):
        frame = synthetic_shard(shard, start, min(shard_size, rows - start), rng, **kwargs)  # type: ignore[arg-type]
        commit_shard(storage, shard, frame, fingerprint=FINGERPRINT, timings={})
    return storage


def committed_ids(frames: Sequence[pl.DataFrame]) -> list[str]:
    return [i for f in frames for i in f["id"].to_list()]
