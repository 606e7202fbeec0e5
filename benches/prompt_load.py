"""Prompt loading speed and memory on a synthetic JSONL file (default 1M rows, ~100 bytes each).

Rows mix plain messages rows, id-less rows (their ids are hashed) and one malformed line per
50,000 rows (each found by bisection). Each load runs in a child process so its peak RSS
(ru_maxrss) is its own. Usage: python benches/prompt_load.py [--rows N ...] [--smoke]
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
import resource, sys, time
from regen.prompts import load_prompts
start = time.perf_counter()
ps = load_prompts(sys.argv[1])
elapsed = time.perf_counter() - start
print(ps.num_valid, ps.num_rejected, elapsed,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def write_jsonl(path: Path, rows: int) -> None:
    with_id = '{{"id": "r{0}", "messages": [{{"role": "user", "content": "question {0} {1}"}}]}}'
    no_id = (
        '{{"messages": [{{"role": "system", "content": "sys"}}, '
        '{{"role": "user", "content": "q {0}"}}]}}'
    )
    filler = "lorem ipsum dolor sit amet"
    with path.open("w") as fh:
        for start in range(0, rows, 10_000):
            block = [
                (no_id if i % 4 == 0 else with_id).format(i, filler)
                for i in range(start, min(rows, start + 10_000))
            ]
            if start % 50_000 == 0:
                block.append("{broken")
            fh.write("\n".join(block) + "\n")


def measure(rows: int, tmp: Path) -> dict[str, float]:
    path = tmp / f"prompts-{rows}.jsonl"
    write_jsonl(path, rows)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        "rows": rows,
        "file_mib": round(path.stat().st_size / 2**20, 1),
        "valid": int(out[0]),
        "rejected": int(out[1]),
        "load_s": round(float(out[2]), 2),
        "peak_rss_mib": int(out[3]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000, 1_000_000])
    parser.add_argument("--smoke", action="store_true", help="10,000 rows")
    args = parser.parse_args()
    if args.smoke:
        args.rows = [10_000]
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(rows, Path(tmp)) for rows in args.rows]
    keys = list(results[0])
    print(" | ".join(f"{k:>12}" for k in keys))
    for r in results:
        print(" | ".join(f"{r[k]:>12}" for k in keys))
    marked = [{**r, "smoke": args.smoke} for r in results]
    results_path("prompt_load", smoke=args.smoke).write_text(json.dumps(marked, indent=2) + "\n")


if __name__ == "__main__":
    main()
