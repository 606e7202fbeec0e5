"""Audit speed and memory on a synthetic 1M-row dataset (2000 shards of 500 rows).

Token counts are realistic (prompts ~200, reasoning ~1500, answers ~300 tokens, lognormal),
but the texts are shorter (50-100 reasoning words, 20-40 answer words, drawn from pools):
a million real-length reasoning texts would need ~10 GB just to generate. The repetition
and tokenizer passes scale with text length, so real datasets take longer per row.

Each audit runs in a child process so its peak RSS (ru_maxrss) is its own. The first audit
of the big dataset starts from scratch: it computes every shard's summary (one shard in
memory at a time) and stores it under audit/; the second is the final audit as a run that
committed its shards' summaries will have it: a merge of the stored summaries plus the
dataset-level checks. The tokenizer pass uses a byte-level BPE trained here on the pools (no
model download), on 100K rows.
Usage: python benches/audit.py [--rows N] [--tokenizer-rows N] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.dataset import commit_shard, read_committed
from regen.schema import OUTPUT_MESSAGE, TURN, row_schema
from regen.storage import LocalStorage

SHARD = 500
SERVERS = 7
FINGERPRINT = "bench"


def _pool(rng: np.random.Generator, vocab: np.ndarray, size: int, lo: int, hi: int) -> list[str]:
    lens = rng.integers(lo, hi + 1, size)
    # Zipf-like word frequencies, as in prose: common words repeat, 6-grams rarely do.
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    words = rng.choice(vocab, size=int(lens.sum()), p=weights / weights.sum())
    cuts = np.cumsum(lens)[:-1]
    return [" ".join(chunk) for chunk in np.split(words, cuts)]


def _struct(dtype: pl.Struct, **given: pl.Expr | pl.Series) -> pl.Expr:
    """A struct of `dtype`'s fields in order, null where not `given`: new fields cannot break it."""
    fields = [
        (pl.lit(given[f.name]) if isinstance(given.get(f.name), pl.Series) else given.get(f.name))
        for f in dtype.fields
    ]
    return pl.struct(
        [
            (pl.lit(None) if e is None else e).cast(f.dtype).alias(f.name)
            for e, f in zip(fields, dtype.fields, strict=True)
        ]
    )


def conform(columns: dict[str, pl.Expr | pl.Series]) -> pl.DataFrame:
    """A frame of exactly `row_schema()`, its columns from `columns`, null where absent.

    Built from the schema rather than beside it, so a column the output gains later (as
    `turns` and the token ids were) is null here instead of a cast error.
    """
    exprs = []
    for name, dtype in row_schema().items():
        value = columns.get(name)
        expr = pl.lit(value) if isinstance(value, pl.Series) else value
        exprs.append((pl.lit(None) if expr is None else expr).cast(dtype).alias(name))
    return pl.select(exprs)


def generate(root: Path, rows: int, seed: int = 0) -> None:
    """Write `rows` rows as committed shards with plan.parquet and run.json."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(8000)])
    pool = min(20_000, max(rows, 1_000))  # a smoke run's few rows need no big pools
    reasoning = pl.Series(_pool(rng, vocab, pool, 50, 100))
    answers = pl.Series(_pool(rng, vocab, pool, 20, 40))
    prompts = pl.Series(_pool(rng, vocab, 5_000, 10, 30))
    (root / "shards").mkdir(parents=True)
    ids = pl.Series([f"p{i:07d}" for i in range(rows)])
    pl.DataFrame({"id": ids, "shard": pl.Series(np.arange(rows) // SHARD)}).write_parquet(
        root / "plan.parquet"
    )
    run = {"fingerprint": FINGERPRINT, "regeneration": {"thinking": "save"}}
    (root / "run.json").write_text(json.dumps(run))
    storage = LocalStorage(root)
    for shard, start in enumerate(range(0, rows, SHARD)):
        n = min(SHARD, rows - start)
        r_tok = np.clip(rng.lognormal(7.3, 0.6, n), 20, 4000).astype(np.int64)
        a_tok = np.clip(rng.lognormal(5.7, 0.7, n), 5, 2000).astype(np.int64)
        content = answers.gather(rng.integers(0, len(answers), n))
        empty = rng.random(n) < 0.01
        finish = np.where(rng.random(n) < 0.03, "length", "stop")
        error = [("http 500 after 4 attempts" if e else None) for e in rng.random(n) < 0.005]
        prompt_tokens = np.clip(rng.lognormal(5.3, 0.8, n), 10, 30000).astype(np.int64)
        latency = rng.uniform(5, 60, n)
        server = pl.Series([f"server-{s}" for s in rng.integers(0, SERVERS, n)])
        columns: dict[str, pl.Expr | pl.Series] = {
            "id": ids.slice(start, n),
            "shard": pl.lit(shard, pl.Int64),
            "messages": pl.concat_list(
                _struct(
                    OUTPUT_MESSAGE,
                    role=pl.lit("user"),
                    content=prompts.gather(rng.integers(0, len(prompts), n)),
                )
            ),
            "content": pl.when(pl.Series(empty)).then(pl.lit("")).otherwise(content),
            "reasoning_content": reasoning.gather(rng.integers(0, len(reasoning), n)),
            "finish_reason": pl.Series(finish),
            "prompt_tokens": pl.Series(prompt_tokens),
            "completion_tokens": pl.Series(r_tok + a_tok),
            "reasoning_tokens": pl.Series(r_tok),
            "model": pl.lit("qwen3.6-27b"),
            "server": server,
            "attempts": pl.lit(1, pl.Int64),
            "latency_s": pl.Series(latency),
            "error": pl.Series(error, dtype=pl.String),
            # One turn per row, as `regeneration.turns: last` writes; no token ids (null), as
            # a server that returns none, so the audit takes its tokenizer path.
            "turns": pl.concat_list(
                _struct(
                    TURN,
                    turn=pl.lit(1, pl.Int64),
                    finish_reason=pl.Series(finish),
                    prompt_tokens=pl.Series(prompt_tokens),
                    completion_tokens=pl.Series(r_tok + a_tok),
                    reasoning_tokens=pl.Series(r_tok),
                    server=server,
                    attempts=pl.lit(1, pl.Int64),
                    latency_s=pl.Series(latency),
                )
            ),
        }
        frame = conform(columns)
        commit_shard(storage, shard, frame, fingerprint=FINGERPRINT, timings={})


def train_tokenizer(root: Path, out: Path) -> Path:
    """A byte-level BPE (8K vocab) with Qwen's special tokens, trained on the dataset's texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = read_committed(LocalStorage(root), FINGERPRINT).scan([0]).collect()
    corpus = texts["reasoning_content"].drop_nulls().to_list() + texts["content"].to_list()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=8000, special_tokens=specials))
    tok.save(str(out / "tokenizer.json"))
    return out


def child(root: Path, tokenizer: Path | None) -> None:
    from regen.audit import run_audit
    from regen.config import AuditConfig

    start = time.perf_counter()
    result = run_audit(LocalStorage(root), AuditConfig(), tokenizer_path=tokenizer)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "rows": result.rows,
                "seconds": seconds,
                "peak_rss_mb": peak_mb,
                "verdict": result.verdict,
            }
        )
    )


def measure(root: Path, tokenizer: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", str(root)]
    if tokenizer is not None:
        cmd += ["--tokenizer", str(tokenizer)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokenizer-rows", type=int, default=100_000)
    parser.add_argument("--child", type=Path)
    parser.add_argument("--tokenizer", type=Path)
    parser.add_argument("--smoke", action="store_true", help="2,000 rows, 1,000 tokenized")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.tokenizer_rows = 2_000, 1_000
    if args.child:
        child(args.child, args.tokenizer)
        return
    with tempfile.TemporaryDirectory(prefix="regen-audit-bench-") as tmp:
        big, small, tok = Path(tmp, "big"), Path(tmp, "small"), Path(tmp, "tok")
        t = time.perf_counter()
        generate(big, args.rows)
        generate(small, args.tokenizer_rows, seed=1)
        tok.mkdir()
        train_tokenizer(small, tok)
        gen_s = time.perf_counter() - t
        plain = measure(big)
        merge_only = measure(big)
        summaries = sum(p.stat().st_size for p in (big / "audit").iterdir())
        with_tok = measure(small, tok)
    rows_per_s = with_tok["rows"] / with_tok["seconds"]
    table = [
        ("dataset generation (s)", f"{gen_s:.1f}"),
        (
            f"audit from scratch, {plain['rows']:,} rows, no tokenizer (s)",
            f"{plain['seconds']:.1f}",
        ),
        ("  rows/s", f"{plain['rows'] / plain['seconds']:,.0f}"),
        ("  peak RSS (MB)", f"{plain['peak_rss_mb']:,.0f}"),
        ("final audit, merge of stored summaries (s)", f"{merge_only['seconds']:.1f}"),
        ("  peak RSS (MB)", f"{merge_only['peak_rss_mb']:,.0f}"),
        ("  summaries stored (MB)", f"{summaries / 1e6:,.1f}"),
        (f"audit, {with_tok['rows']:,} rows, with tokenizer (s)", f"{with_tok['seconds']:.1f}"),
        ("  rows/s", f"{rows_per_s:,.0f}"),
        ("  peak RSS (MB)", f"{with_tok['peak_rss_mb']:,.0f}"),
    ]
    width = max(len(k) for k, _ in table)
    for key, value in table:
        print(f"{key:<{width}}  {value:>10}")
    results_path("audit", smoke=args.smoke).write_text(
        json.dumps(
            {
                "rows": plain["rows"],
                "seconds": round(plain["seconds"], 2),
                "peak_rss_mb": round(plain["peak_rss_mb"], 1),
                "merge_seconds": round(merge_only["seconds"], 2),
                "merge_peak_rss_mb": round(merge_only["peak_rss_mb"], 1),
                "summaries_mb": round(summaries / 1e6, 2),
                "tokenizer_rows": with_tok["rows"],
                "tokenizer_seconds": round(with_tok["seconds"], 2),
                "tokenizer_rows_per_s": round(rows_per_s, 1),
                "tokenizer_peak_rss_mb": round(with_tok["peak_rss_mb"], 1),
                "text_words": {"reasoning": [50, 100], "answer": [20, 40]},
                "smoke": args.smoke,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
