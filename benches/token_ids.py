"""Storage cost of the server's token ids: bytes per row with and without them.

Generates the bundled sample prompts twice through one real emulator (the rehearsal's
default lengths: 200-4000 reasoning, 20-800 answer tokens), once with `regeneration.token_ids`
on and once off, and writes each result the way a shard is committed (Parquet, zstd). The
emulator is deterministic, so both runs hold the same text and differ only by the ids.

    .venv/bin/python benches/token_ids.py [--smoke]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

import polars as pl
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.client import Dispatcher
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.prompts import load_prompts_file
from regen.sglang_api.endpoint import Endpoint
from support.emulator import emulators

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "regen" / "data" / "sample_prompts.jsonl"
KEY = "bench-key"


def _generate(url: str, rows: pl.DataFrame, token_ids: bool) -> pl.DataFrame:
    dispatcher = Dispatcher(
        [Endpoint(0, url)],
        api_key=SecretStr(KEY),
        model="m",
        sampling=SamplingConfig(max_tokens=8192),
        generation=GenerationConfig(),
        concurrency_per_server=64,
        regeneration=RegenerationConfig(token_ids=token_ids),
    )
    with dispatcher:
        return dispatcher.submit_shard(0, rows).result(timeout=600)


def _parquet_bytes(frame: pl.DataFrame) -> int:
    buf = io.BytesIO()
    frame.write_parquet(buf, compression="zstd")  # as regen.dataset commits a shard
    return len(buf.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="40 prompts, short outputs (seconds)")
    a = p.parse_args()
    rows = load_prompts_file(PROMPTS).valid.select("id", "messages")
    reasoning, answer = ("20:200", "20:100") if a.smoke else ("200:4000", "20:800")
    if a.smoke:
        rows = rows.head(40)
    with tempfile.TemporaryDirectory(prefix="regen-token-ids-") as tmp:
        flags = [
            "--reasoning-parser", "qwen3", "--max-running-requests", "64",
            "--emu-load-s", "0", "--emu-time-scale", "0.0005",
            "--emu-reasoning-tokens", reasoning, "--emu-answer-tokens", answer,
        ]  # fmt: skip
        with emulators(Path(tmp), [flags], served_name="m", api_key=KEY) as (emu,):
            frames = {on: _generate(emu.url, rows, on) for on in (False, True)}
    n = rows.height
    turns = frames[True]["turns"].explode().struct.unnest()
    result: dict[str, object] = {
        "rows": n,
        "reasoning_tokens": reasoning,
        "answer_tokens": answer,
        "mean_prompt_ids": turns["prompt_token_ids"].list.len().mean(),
        "mean_response_ids": turns["response_token_ids"].list.len().mean(),
        "parquet_bytes_per_row_without_ids": _parquet_bytes(frames[False]) / n,
        "parquet_bytes_per_row_with_ids": _parquet_bytes(frames[True]) / n,
        "memory_bytes_per_row_without_ids": frames[False].estimated_size() / n,
        "memory_bytes_per_row_with_ids": frames[True].estimated_size() / n,
    }
    result["parquet_ratio"] = _parquet_bytes(frames[True]) / _parquet_bytes(frames[False])
    result["smoke"] = a.smoke
    results_path("token_ids", smoke=a.smoke).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'figure':36} {'value':>12}")
    for key, value in result.items():
        shown = f"{value:>12.1f}" if isinstance(value, float) else f"{value!s:>12}"
        print(f"{key:36} {shown}")


if __name__ == "__main__":
    main()
