"""Export speed and memory per format on 1M synthetic rows with the server's token ids, and
the audit of the same rows.

Rows are one-turn conversations as `regeneration.turns: last` stores them: SGLang-shaped
texts (`content` starting "\\n\\n", `reasoning_content` ending "\\n", drawn from pools) and
`prompt_token_ids` / `response_token_ids` of `--prompt-tokens` / `--response-tokens` tokens
on average (uniform from half to one and a half times). 0.5 % are error rows, 3 % truncated.
Shards of 500 rows, as a run writes them by default.

Each export and the audit run in a child process, so each peak RSS (ru_maxrss) is its own;
rows/s counts every committed row read (wall clock); rows per CPU second is the same work
per second of the child's own CPU time, which load from other processes does not change.
Usage: python benches/export.py [--rows N] [--smoke] [--prompt-tokens N] [--response-tokens N]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.dataset import commit_shard, read_committed
from regen.schema import TURN, row_schema
from regen.storage import LocalStorage

SHARD = 500
FINGERPRINT = "bench"
FORMATS = ("specforge", "tokenized", "hf-dataset", "messages")
VARIANTS = {
    "specforge --single-file": {"format": "specforge", "single_file": True},
    "hf-dataset --token-freq": {"format": "hf-dataset", "token_freq": True},
}
"""Options measured besides the formats' defaults: the one file SpecForge opens, and
speculators' token_freq.pt (a second pass over the written Arrow files)."""
TARGETS = {"jsonl_rows_per_s": 50_000, "hf_dataset_rows_per_s": 20_000, "peak_rss_mb": 1024}


def _token_lists(rng: np.random.Generator, lengths: np.ndarray) -> pl.Series:
    """Variable-length int32 lists without a Python loop (an Arrow list over one buffer)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(0, 151_000, int(offsets[-1]), dtype=np.int32)
    return pl.Series(pl.from_arrow(pa.ListArray.from_arrays(offsets, values)))


def _pool(rng: np.random.Generator, size: int, words: int, prefix: str, suffix: str) -> pl.Series:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(4000)]
    drawn = rng.choice(vocab, size=(size, words))
    return pl.Series([prefix + " ".join(w) + suffix for w in drawn])


def generate(root: Path, rows: int, prompt_tokens: int, response_tokens: int) -> None:
    """`rows` rows as committed shards, with plan.parquet and run.json."""
    rng = np.random.default_rng(0)
    prompts = _pool(rng, 2000, 20, "", "")
    answers = _pool(rng, 2000, 30, "\n\n", "")
    reasoning = _pool(rng, 2000, 60, "", "\n")
    (root / "shards").mkdir(parents=True)
    ids = pl.Series([f"p{i:07d}" for i in range(rows)])
    plan = pl.DataFrame({"id": ids, "shard": pl.Series(np.arange(rows) // SHARD)})
    plan.write_parquet(root / "plan.parquet")
    run = {"fingerprint": FINGERPRINT, "regeneration": {"thinking": "save", "turns": "last"}}
    (root / "run.json").write_text(json.dumps(run))
    storage = LocalStorage(root)
    for shard, start in enumerate(range(0, rows, SHARD)):
        n = min(SHARD, rows - start)
        p_len = rng.integers(prompt_tokens // 2, prompt_tokens * 3 // 2 + 1, n)
        r_len = rng.integers(max(1, response_tokens // 2), response_tokens * 3 // 2 + 1, n)
        error = rng.random(n) < 0.005
        finish = pl.Series(np.where(rng.random(n) < 0.03, "length", "stop"))
        frame = pl.DataFrame(
            {
                "id": ids.slice(start, n),
                "prompt": prompts.gather(rng.integers(0, len(prompts), n)),
                "content": answers.gather(rng.integers(0, len(answers), n)),
                "reasoning_content": reasoning.gather(rng.integers(0, len(reasoning), n)),
                "finish_reason": finish,
                "prompt_tokens": p_len.astype(np.int64),
                "completion_tokens": r_len.astype(np.int64),
                "reasoning_tokens": (r_len // 2).astype(np.int64),
                "error": pl.Series([("http 500 after 4 attempts" if e else None) for e in error]),
                "prompt_token_ids": _token_lists(rng, p_len),
                "response_token_ids": _token_lists(rng, r_len),
            }
        )
        ok = pl.col("error").is_null()
        turn = pl.struct(
            turn=pl.lit(1, pl.Int64),
            finish_reason="finish_reason",
            prompt_tokens="prompt_tokens",
            completion_tokens="completion_tokens",
            reasoning_tokens="reasoning_tokens",
            reasoning_effort=pl.lit(None, pl.String),
            server=pl.lit("server-0"),
            attempts=pl.lit(1, pl.Int64),
            latency_s=pl.lit(1.0),
            prompt_token_ids="prompt_token_ids",
            response_token_ids="response_token_ids",
        ).cast(TURN)
        rows_frame = frame.select(
            "id",
            pl.lit(shard, pl.Int64).alias("shard"),
            pl.concat_list(
                pl.struct(
                    role=pl.lit("user"), content="prompt", reasoning_content=pl.lit(None, pl.String)
                )
            ).alias("messages"),
            *(pl.when(ok).then(c).alias(c) for c in ("content", "reasoning_content")),
            pl.when(ok).then("finish_reason").alias("finish_reason"),
            "prompt_tokens",
            "completion_tokens",
            "reasoning_tokens",
            pl.lit("qwen3.6-27b").alias("model"),
            pl.lit("server-0").alias("server"),
            pl.lit(1, pl.Int64).alias("attempts"),
            pl.lit(1.0).alias("latency_s"),
            "error",
            pl.when(ok)
            .then(pl.concat_list(turn))
            .otherwise(pl.lit([], pl.List(TURN)))
            .alias("turns"),
        )
        schema = row_schema()
        # The columns a plain rehearsal leaves null (tools, the sampling draw).
        missing = [pl.lit(None, schema[c]).alias(c) for c in schema if c not in rows_frame.columns]
        rows_frame = rows_frame.with_columns(missing).select(schema.names())
        commit_shard(storage, shard, rows_frame.cast(schema), fingerprint=FINGERPRINT, timings={})


def child(kind: str, root: Path, dest: Path) -> None:
    start = time.perf_counter()
    out: dict[str, object]
    if kind == "audit":
        from regen.audit import run_audit
        from regen.config import AuditConfig

        result = run_audit(LocalStorage(root), AuditConfig())
        out = {"rows": result.rows, "verdict": result.verdict}
    elif kind == "loss-mask":
        # The id-based loss mask alone over every row, streamed: what the loss-mask check computes.
        from regen.lossmask import samples_from_ids

        rows = read_committed(LocalStorage(root)).scan().filter(pl.col("error").is_null())
        figures = (
            samples_from_ids(rows)
            .select(pl.len().alias("samples"), pl.col("loss_tokens").sum())
            .collect(engine="streaming")
        )
        out = {"rows": figures["samples"].item(), "loss_tokens": figures["loss_tokens"].item()}
    else:
        from regen.config import ExportOptions
        from regen.export.exporter import export_dataset

        options = ExportOptions.model_validate(VARIANTS.get(kind, {"format": kind}))
        summary = export_dataset(LocalStorage(root), LocalStorage(dest), options)
        counts = summary.counts
        out = {"rows": counts["rows"] + counts["error_rows"], "samples": counts["samples"]}
        out["bytes"] = sum(p.stat().st_size for p in dest.iterdir())
    out["seconds"] = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["cpu_s"] = usage.ru_utime + usage.ru_stime  # imports included: under a second
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def measure(kind: str, root: Path, dest: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, str(root), str(dest)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{kind} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--smoke", action="store_true", help="5,000 rows: seconds, not minutes.")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "ROOT", "DEST"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return
    rows = 5_000 if args.smoke else args.rows
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="regen-export-bench-") as tmp:
        root = Path(tmp, "dataset")
        t = time.perf_counter()
        generate(root, rows, args.prompt_tokens, args.response_tokens)
        gen_s = time.perf_counter() - t
        for kind in (*FORMATS, *VARIANTS, "loss-mask", "audit"):
            dest = Path(tmp, kind)
            figures[kind] = measure(kind, root, dest)
            shutil.rmtree(dest, ignore_errors=True)  # 1M rows of JSONL are gigabytes
    exports = (*FORMATS, *VARIANTS)
    per_s = {k: figures[k]["rows"] / figures[k]["seconds"] for k in exports}
    peak = max(figures[k]["peak_rss_mb"] for k in (*exports, "audit"))
    table = [("dataset generation (s)", f"{gen_s:.1f}")]
    for kind in exports:
        f = figures[kind]
        table += [
            (f"{kind}: rows/s", f"{per_s[kind]:,.0f}"),
            ("  rows per CPU second", f"{f['rows'] / f['cpu_s']:,.0f}"),
            (f"  {f['samples']:,} samples, output (MB)", f"{f['bytes'] / 1e6:,.0f}"),
            ("  peak RSS (MB)", f"{f['peak_rss_mb']:,.0f}"),
        ]
    table += [
        (f"loss mask from ids, {figures['loss-mask']['rows']:,} samples (s)",
         f"{figures['loss-mask']['seconds']:.1f}"),
        (f"audit, {figures['audit']['rows']:,} rows (s)", f"{figures['audit']['seconds']:.1f}"),
        ("  peak RSS (MB)", f"{figures['audit']['peak_rss_mb']:,.0f}"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in table)
    for key, value in table:
        print(f"{key:<{width}}  {value:>10}")
    results_path("export", smoke=args.smoke).write_text(
        json.dumps(
            {
                "rows": rows,
                "specforge_rows_per_s": round(per_s["specforge"]),
                "tokenized_rows_per_s": round(per_s["tokenized"]),
                "hf_dataset_rows_per_s": round(per_s["hf-dataset"]),
                "messages_rows_per_s": round(per_s["messages"]),
                "specforge_single_file_rows_per_s": round(per_s["specforge --single-file"]),
                "hf_dataset_token_freq_rows_per_s": round(per_s["hf-dataset --token-freq"]),
                "peak_rss_mb": round(peak, 1),
                "audit_s": round(figures["audit"]["seconds"], 2),
                "loss_mask_from_ids_s": round(figures["loss-mask"]["seconds"], 2),
                "peak_rss_mb_by_format": {
                    k: round(figures[k]["peak_rss_mb"], 1) for k in (*exports, "audit")
                },
                # Wall rows/s depends on what else the shared machine runs; this does not.
                "rows_per_cpu_s_by_format": {
                    k: round(figures[k]["rows"] / figures[k]["cpu_s"]) for k in exports
                },
                "audit_cpu_s": round(figures["audit"]["cpu_s"], 2),
                "output_mb_by_format": {k: round(figures[k]["bytes"] / 1e6) for k in exports},
                "tokens_per_row": {"prompt": args.prompt_tokens, "response": args.response_tokens},
                "shard_rows": SHARD,
                "smoke": args.smoke,
                "targets": TARGETS,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
