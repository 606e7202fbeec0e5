"""regen against ideal (issue 48's side-by-side table, regen's columns): generation and end to end.

The issue's setup: 2,000 prompts on 4 emulated servers x 16 slots at time scale 0.2 (the
emulator's default answers: 200-4,000 reasoning and 20-800 answer tokens, log-uniform, at 250
tok/s a request), started once per case and attached to (`engine.kind: external`); each run is
`regen run --config` in a subprocess, as a user runs it, with its own temporary Prefect server
on a warm Prefect home (a small first run sets its database up and is not counted). The
servers sample by a request's seed (`--enable-deterministic-inference`) and the config says
so (`engine.deterministic: true`), so `generation.hedge: auto` hedges, as on such a GPU fleet.

Cases: `even` (every server at full speed) and `slow` (server-0 at half speed, the emulator's
`slow=0.5`). Per run:

- ideal: the rows' completion tokens over the fleet's capacity (every slot decoding at its
  server's speed, all the time);
- generation: the generation stage's wall (progress.json `elapsed_s`: the canary, the shards,
  their commits), and end to end: the command's wall, start to exit;
- the fixed cost, split by the run's own log lines: to `Beginning flow run` (imports, Prefect's
  temporary server), provisioning, model/plan/fleet (the attach's probes and micro-benchmark),
  the final audit and report, and the exit;
- perfect FIFO: generation / ideal of a dispatcher with no overhead on the run's very answers
  (benches.affinity.fifo_bound, with hedging as the run had it): what any dispatcher that
  cannot know an answer's length before it ends reaches, the last wave's drain included.

`--code DIR` runs another checkout's `regen` (its own .venv), e.g. a worktree of main, against
the same servers, with its own defaults (without `engine.deterministic` and `generation.hedge`,
which it may not know): two versions on one machine at one load.

    .venv/bin/python benches/vs_ideal.py [--prompts 2000] [--servers 4] [--slots 16]
        [--time-scale 0.2] [--repeats 1] [--cases even,slow] [--code DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from benches.affinity import fifo_bound
from benches.scale import write_prompts
from regen.dataset import read_committed
from regen.storage import LocalStorage
from support.emulator import MODEL_DIR, emulators
from support.prefect import prefect_env

REPO = Path(__file__).resolve().parents[1]
SERVED = "emu-model"
KEY = "vs-ideal-bench-key"
TOKENS_PER_S = 250.0
_BEHIND = re.compile(r"canary: .*; ([\d,]+) shard rows sent behind it")
_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) \| \w+ +\| (.*)$")
# Milestones of the run's log, in order: (name, pattern of the line that ends it).
MILESTONES = (
    ("prefect", re.compile(r"Beginning flow run")),
    ("provision", re.compile(r"Task run 'provision-[^']*' - Finished in state")),
    ("fleet", re.compile(r"Task run 'launch-fleet-[^']*' - Finished in state")),
    ("generation", re.compile(r"Task run 'generate-shard-[^']*' - Finished in state")),
    ("audit", re.compile(r"Task run 'audit-[^']*' - Finished in state")),
)


def _seconds_of_day(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def milestones(log: str, started: float) -> dict[str, float]:
    """Seconds from the command's start to the last line of each milestone in its log."""
    day = datetime.fromtimestamp(started)
    t0 = day.hour * 3600 + day.minute * 60 + day.second + day.microsecond / 1e6
    found: dict[str, float] = {}
    for line in log.splitlines():
        parsed = _LINE.match(line)
        if not parsed:
            continue
        at = _seconds_of_day(*parsed.groups()[:4]) - t0
        for name, pattern in MILESTONES:
            if pattern.search(parsed.group(5)):
                found[name] = at
    return found


def _config(
    path: Path, root: Path, urls: list[str], prompts: Path, args: argparse.Namespace
) -> Path:
    data: dict[str, Any] = {
        "model": {"source": str(MODEL_DIR), "served_name": SERVED, "stage": False},
        "prompts": str(prompts),
        "output": str(root / "out"),
        "work_dir": str(root / "work"),
        "concurrency_per_server": args.slots,
        "engine": {
            "kind": "external",
            "urls": urls,
            "api_key": KEY,
            "max_running_requests": args.slots,
        },
    }
    if args.code.resolve() == REPO:  # keys an older checkout (--code) does not know
        data["engine"]["deterministic"] = True
        data["generation"] = {"hedge": args.hedge}
    if args.smoke:  # the launch's micro-benchmark at its smallest
        data["engine"]["bench"] = {"concurrency": 2, "max_tokens": 16, "budget_s": 1}
    path.write_text(yaml.safe_dump(data))
    return path


def _regen(code: Path) -> list[str]:
    python = code / ".venv" / "bin" / "python"
    return [str(python if python.exists() else sys.executable), "-m", "flows.cli"]


def run_once(
    code: Path, config: Path, env: dict[str, str], log: Path, timeout: float
) -> tuple[float, float]:
    """`regen run --config`: (its wall seconds, its start as epoch seconds)."""
    started = time.time()
    t0 = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(
            [*_regen(code), "run", "--config", str(config)],
            cwd=code, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
            check=False,
        )  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"vs_ideal: regen run exited {done.returncode}; see {log}")
    return wall, started


def measure(
    args: argparse.Namespace, case: str, root: Path, env: dict[str, str], code: Path
) -> dict[str, Any]:
    slow = 0.5 if case == "slow" else None
    speeds = [slow or 1.0] + [1.0] * (args.servers - 1)
    flags = [
        [
            "--max-running-requests", str(args.slots), "--enable-metrics",
            "--reasoning-parser", "qwen3", "--enable-deterministic-inference",
            "--emu-load-s", "0", "--emu-tokens-per-s", str(TOKENS_PER_S),
            "--emu-time-scale", str(args.time_scale),
            *(["--emu-fault", f"slow={slow}"] if slow is not None and i == 0 else []),
        ]
        for i in range(args.servers)
    ]  # fmt: skip
    root.mkdir(parents=True)
    prompts = root / "prompts.jsonl"
    write_prompts(prompts, args.prompts)
    capacity = args.slots * sum(speeds) * TOKENS_PER_S / args.time_scale
    runs = []
    logs = root / "logs"
    logs.mkdir()
    with emulators(logs, flags, timeout=120, served_name=SERVED, api_key=KEY) as fleet:
        urls = [e.url for e in fleet]
        for k in range(args.repeats):
            run_root = root / f"run-{k}"
            run_root.mkdir()
            config = _config(run_root / "regen.yaml", run_root, urls, prompts, args)
            load = os.getloadavg()[0]
            wall, started = run_once(code, config, env, run_root / "run.log", args.timeout)
            out = Path(run_root / "out")
            progress = json.loads((out / "progress.json").read_text())
            rows = read_committed(LocalStorage(out)).collect()
            tokens = int(rows["completion_tokens"].sum())
            generation = float(progress["elapsed_s"])
            ideal = tokens / capacity
            log_text = (run_root / "run.log").read_text()
            marks = milestones(log_text, started)
            behind = _BEHIND.search(log_text)
            hedged = args.hedge != "off"
            runs.append(
                {
                    "rows": rows.height,
                    "errors": int(rows["error"].is_not_null().sum()),
                    "ideal_s": round(ideal, 2),
                    "generation_s": round(generation, 2),
                    "end_to_end_s": round(wall, 2),
                    "generation_to_ideal": round(ideal / generation, 4),
                    "end_to_end_to_ideal": round(ideal / wall, 4),
                    "fixed_cost_s": round(wall - generation, 2),
                    "fixed_cost_parts_s": _parts(marks, generation, wall),
                    "perfect_fifo": round(
                        fifo_bound(rows["completion_tokens"].to_list(), speeds, args.slots, hedged),
                        4,
                    ),
                    "servers_of_rows": _servers(rows),
                    # How fast the servers ran against their nominal speed (a loaded machine
                    # runs them slower, which no dispatcher can win back).
                    "served_speed": _served_speed(rows, speeds, args),
                    "canary_rows_behind": int(behind.group(1).replace(",", "")) if behind else None,
                    "load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
                }
            )
    return {
        "case": case,
        "speeds": speeds,
        "runs": runs,
        **{
            key: round(statistics.median(r[key] for r in runs), 4)
            for key in (
                "ideal_s",
                "generation_s",
                "end_to_end_s",
                "generation_to_ideal",
                "end_to_end_to_ideal",
                "fixed_cost_s",
                "perfect_fifo",
            )
        },
    }


def _parts(marks: dict[str, float], generation: float, wall: float) -> dict[str, float]:
    """The fixed cost by stage: to the flow's start, provisioning, plan/model/fleet, the audit
    (from the generation's end), and the exit; generation itself left out."""
    need = ("prefect", "provision", "fleet", "audit")
    if any(name not in marks for name in need):
        return {}
    generated = marks["fleet"] + generation
    return {
        "to_flow_start": round(marks["prefect"], 2),
        "provision": round(marks["provision"] - marks["prefect"], 2),
        "plan_model_fleet": round(marks["fleet"] - marks["provision"], 2),
        "audit_and_report": round(marks["audit"] - generated, 2),
        "to_exit": round(wall - marks["audit"], 2),
    }


def _served_speed(rows: pl.DataFrame, speeds: list[float], args: argparse.Namespace) -> float:
    """The rows' nominal decode seconds (tokens at their server's speed) over their latency."""
    rate = {f"server-{i}": s * TOKENS_PER_S / args.time_scale for i, s in enumerate(speeds)}
    nominal = rows.select(
        (pl.col("completion_tokens") / pl.col("server").replace_strict(rate)).sum()
    ).item()
    return round(float(nominal) / float(rows["latency_s"].sum()), 4)


def _servers(rows: pl.DataFrame) -> dict[str, int]:
    counts = rows.group_by("server").len().sort("server")
    return {str(s): int(n) for s, n in counts.iter_rows()}


def print_table(result: dict[str, Any]) -> None:
    s = result["setup"]
    print(
        f"regen vs ideal: {s['prompts']:,} prompts, {s['servers']} servers x {s['slots']} slots, "
        f"time scale {s['time_scale']:g}, hedge {s['hedge']} ({s['code']})"
    )
    head = ("case", "ideal s", "generation s", "end to end s", "gen/ideal", "e2e/ideal",
            "fixed s", "perfect FIFO", "load")  # fmt: skip
    print(" | ".join(head))
    for case in result["cases"]:
        loads = ", ".join(f"{r['load_average_1m'][0]:.1f}" for r in case["runs"])
        print(
            f"{case['case']} | {case['ideal_s']:.1f} | {case['generation_s']:.1f} | "
            f"{case['end_to_end_s']:.1f} | {case['generation_to_ideal']:.3f} | "
            f"{case['end_to_end_to_ideal']:.3f} | {case['fixed_cost_s']:.1f} | "
            f"{case['perfect_fifo']:.3f} | {loads}"
        )
        for run in case["runs"]:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in run["fixed_cost_parts_s"].items())
            print(f"    fixed cost {run['fixed_cost_s']:.1f} s: {parts}")
            print(
                f"    servers ran at {run['served_speed']:.3f} of their nominal speed; "
                f"{run['canary_rows_behind']} shard rows sent behind the canary; "
                f"rows per server {run['servers_of_rows']}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cases", default="even,slow")
    parser.add_argument("--hedge", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose regen runs")
    parser.add_argument(
        "--prefect-home", type=Path, help="the runs' Prefect home (default: a fresh one)"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    parser.add_argument("--smoke", action="store_true", help="120 prompts, 2 x 4 slots, 0.01")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.servers, args.slots, args.time_scale = 120, 2, 4, 0.01
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or set(cases) - {"even", "slow"}:
        parser.error(f"--cases: even, slow or both, not {args.cases!r}")
    code = args.code.resolve()
    measured = []
    with tempfile.TemporaryDirectory(prefix="regen-vs-ideal-") as tmp:
        home = args.prefect_home or Path(tmp) / "prefect-home"
        env = {**prefect_env(home), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
        if not args.smoke:
            # A first run sets the Prefect database up (every migration): not what a run costs.
            warm = argparse.Namespace(**{**vars(args), "prompts": 16, "repeats": 1})
            measure(warm, "even", Path(tmp) / "warm-up", env, code)
        for case in cases:
            measured.append(measure(args, case, Path(tmp) / case, env, code))
    result = {
        "setup": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "cpu_count": os.cpu_count(),
        "cases": measured,
    }
    print_table(result)
    path = results_path("vs_ideal", smoke=args.smoke)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
