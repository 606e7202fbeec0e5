"""Prompt loading speed and memory on a synthetic JSONL file (default 1M rows, ~100 bytes each).

Rows mix plain messages rows, id-less rows (their ids are hashed) and one malformed line per
50,000 rows (each found by bisection); the `mixed` case spreads the rows over every format a
row may describe itself with (messages, prompt + system, ShareGPT, SpecForge turns), and
`prompt` is prompt rows alone, half of them with a system key. Each load runs in a child
process so its peak RSS (ru_maxrss) is its own; after the load it plans the shards and writes
the prompt cache, as the plan stage does, for the plan stage's peak (plan_peak_rss_mib).
Usage: python benches/prompt_load.py [--rows N ...] [--cases messages mixed prompt] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path

_CHILD = """
import resource, sys, tempfile, time
from pathlib import Path
from regen.prompts import load_prompts
from regen.dataset import cache_prompts, plan_shards
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
start = time.perf_counter()
ps = load_prompts(sys.argv[1])
elapsed, cpu_s, load_rss = time.perf_counter() - start, cpu(), peak()
# The rest of the plan stage's work: the shard plan and the prompt cache shard tasks read.
with tempfile.TemporaryDirectory() as tmp:
    cache_prompts(ps, plan_shards(ps, 500), Path(tmp) / "cache.parquet")
print(ps.num_valid, ps.num_rejected, elapsed, cpu_s, load_rss, peak())
"""


WITH_ID = '{{"id": "r{0}", "messages": [{{"role": "user", "content": "question {0} {1}"}}]}}'
NO_ID = (
    '{{"messages": [{{"role": "system", "content": "sys"}}, '
    '{{"role": "user", "content": "q {0}"}}]}}'
)
PROMPT = '{{"id": "r{0}", "prompt": "question {0} {1}", "system": "sys"}}'
# Four rows of each case, cycled: `mixed` has a quarter each of messages, prompt (+ system),
# ShareGPT and SpecForge rows; `prompt` half its rows with a system key.
CASES = {
    "messages": [NO_ID, WITH_ID, WITH_ID, WITH_ID],
    "mixed": [
        WITH_ID,
        PROMPT,
        '{{"id": "r{0}", "conversations": [{{"from": "human", "value": "question {0} {1}"}}]}}',
        '{{"conversations": [{{"role": "user", "content": "q {0} {1}"}}]}}',
    ],
    "prompt": [PROMPT, '{{"prompt": "q {0} {1}"}}'] * 2,
}


def write_jsonl(path: Path, rows: int, case: str = "messages") -> None:
    templates = CASES[case]
    filler = "lorem ipsum dolor sit amet"
    with path.open("w") as fh:
        for start in range(0, rows, 10_000):
            block = [
                templates[i % 4].format(i, filler) for i in range(start, min(rows, start + 10_000))
            ]
            if start % 50_000 == 0:
                block.append("{broken")
            fh.write("\n".join(block) + "\n")


def measure(rows: int, tmp: Path, case: str) -> dict[str, float | str]:
    path = tmp / f"prompts-{case}-{rows}.jsonl"
    write_jsonl(path, rows, case)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True
    ).stdout.split()
    size = path.stat().st_size
    path.unlink()  # the next file has the disk space
    return {
        "case": case,
        "rows": rows,
        "file_mib": round(size / 2**20, 1),
        "valid": int(out[0]),
        "rejected": int(out[1]),
        "load_s": round(float(out[2]), 2),
        # CPU seconds of the child process (all threads, start-up included): steadier than
        # load_s on a shared machine.
        "cpu_s": round(float(out[3]), 1),
        "peak_rss_mib": int(out[4]),
        "plan_peak_rss_mib": int(out[5]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=["messages", "mixed"])
    parser.add_argument("--smoke", action="store_true", help="10,000 rows")
    args = parser.parse_args()
    if args.smoke:
        args.rows = [10_000]
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(rows, Path(tmp), case) for rows in args.rows for case in args.cases]
    keys = list(results[0])
    print(" | ".join(f"{k:>12}" for k in keys))
    for r in results:
        print(" | ".join(f"{r[k]:>12}" for k in keys))
    marked = [{**r, "smoke": args.smoke} for r in results]
    results_path("prompt_load", smoke=args.smoke).write_text(json.dumps(marked, indent=2) + "\n")


if __name__ == "__main__":
    main()
