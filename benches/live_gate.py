"""Live-gate bench: what the gate saves on a bad run and costs on a healthy one, in the real flow.

Every run is `regenerate_completions(config, return_state=True)`, the flow `regen rehearse`
runs, called in this process under one `prefect_test_harness` (its API server is up before
the first run, so no run's wall time carries Prefect's start). Each run gets a rehearsal
config (`regen.rehearsal.rehearsal_config`: emulators, the engine's defaults otherwise) with
its own output and work dir, so none is a rerun of another.

Two cases, each an incident and clean runs on the same fleet (`--servers` x `--slots`):

- `emulator`: the rehearsal's own speed (time scale 0.01: a request takes tens of ms, about
  as long as the canary's audit). The canary's tail and its audit weigh here as nowhere else.
- `gpu`: request durations in GPU proportion (`--gpu-time-scale`, default 1: the emulator's
  250 tok/s per request in real time, answers of 200-4,000 reasoning tokens and 20-800
  answer tokens, seconds a request, where a real GPU takes a minute or more): the canary's
  audit is small beside one request, as on a node, and a run is a few waves of the fleet.
  What "with" costs here is what a real run pays once, at its start.

- incident: every server with `empty-answer=0.87` on `--prompts` synthetic prompts.
  `seconds_to_stop` is the wall time from calling the flow to its final (Failed) state.
  What the stop threw away is what was sent beyond the canary: the dispatcher's count
  (`prompts_sent` in `report/stopped.json`) less the canary's rows, in waves of the fleet's
  slots (servers x slots): what the slots the canary freed took until its verdict (GPU time
  they would otherwise have idled), at most the shards in flight. The servers' own count
  (summed from their logs, `Served N requests` at shutdown, less the launch's probes and
  micro-benchmark, measured on the clean runs without the gate, which send every prompt
  once) is beside it.
- clean: no fault, `--clean-prompts` prompts, the gate on (defaults: canary 256 prompts,
  `audit.live: stop`) and off (`generation.canary_prompts: 0`, `audit.live: off`),
  alternated (the order flips every repeat) `--repeats` times each, each repeat with answers
  of its own (the emulators' seed: the same work with and without, and a run's last answers,
  which set its tail, drawn anew rather than one order's luck every time). Both kinds store each
  committed shard's audit summary and merge it into the running figures; "off" saves the
  canary and the judging (stop, quarantine). The shards' rows keep every slot busy behind the
  canary until its verdict (their commits wait for it), however many that takes: each clean
  run with the gate says how many it sent (the flow's `canary: ...` log line).
  `generation_overhead_ratio` is median(with) / median(without) - 1 of the generation stage
  (progress.json's `elapsed_s`), where the canary's cost lies, free of the launch's and the
  audit's noise: target <= 2 % (`generation_overhead_paired`: the median of each repeat's
  with / without, the same answers). The flow's wall is beside it (`clean_overhead_ratio`); it
  is rounded up to Prefect's heartbeat (on exit the flow joins its heartbeat thread, which
  sleeps in 1 s slices), so the wall to the flow's last write (report/audit.json) is too.

The machine's load average is recorded at the start and the end of each case: on a shared
machine the figures move with it, which is why with and without alternate.

    .venv/bin/python benches/live_gate.py [--prompts 5000] [--clean-prompts 2000]
        [--servers 4] [--slots 16] [--repeats 5] [--cases emulator,gpu]
        [--gpu-time-scale 1.0] [--gpu-clean-prompts 640] [--gpu-repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from benches.scale import write_prompts
from regen.canary.stop import read_stop_record
from regen.config import RegenConfig
from regen.dataset import read_committed
from regen.display.figures import pct
from regen.rehearsal import rehearsal_config
from regen.storage import LocalStorage

INCIDENT = "empty-answer=0.87"
GATE_OFF = {"generation": {"canary_prompts": 0}, "audit": {"live": "off"}}
# The launch's own requests, small beside the runs' at any speed.
LAUNCH_BENCH = {"concurrency": 4, "max_tokens": 64, "budget_s": 5}
_SERVED = re.compile(r"Shutting down\. Served (\d+) requests\.")
_BEHIND = re.compile(r"canary: .*; ([\d,]+) shard rows sent behind it")


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    emulator: dict[str, Any]
    incident_prompts: int
    clean_prompts: int
    repeats: int


class CanaryLines(logging.Handler):
    """The flow's `canary: ...` log lines: how many shard rows each canary had behind it."""

    def __init__(self) -> None:
        super().__init__()
        self.behind: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = _BEHIND.search(record.getMessage())
        if found:
            self.behind.append(int(found.group(1).replace(",", "")))

    def take(self) -> int | None:
        """The last run's count (None: its canary said none), and listen for the next run's
        (on the flow's logger, whose handlers Prefect's logging setup replaces)."""
        taken = self.behind[-1] if self.behind else None
        self.behind.clear()
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            logger = logging.getLogger(name)
            if self not in logger.handlers:
                logger.addHandler(self)
        return taken


def _config(
    root: Path, prompts: Path, args: argparse.Namespace, case: Case, faults: list[str], *,
    gate: bool, seed: int = 0,
) -> RegenConfig:  # fmt: skip
    """A rehearsal config of its own output and work dir under `root`; `seed` draws the
    emulators' answers (every server answers a prompt alike, whichever gets it)."""
    root.mkdir(parents=True)
    data: dict[str, Any] = {
        "work_dir": str(root / "work"),
        "concurrency_per_server": args.slots,
        "engine": {"bench": LAUNCH_BENCH, "emulator": {**case.emulator, "seed": seed}},
    }
    if not gate:
        data |= GATE_OFF
    path = root / "regen.yaml"
    path.write_text(yaml.safe_dump(data))
    return rehearsal_config(
        config_path=path, prompts=str(prompts), out=str(root / "out"), servers=args.servers,
        faults=faults,
    )  # fmt: skip


def _served(config: RegenConfig) -> int:
    """Requests the run's emulators answered, from their logs (every lifetime of each)."""
    # Each run's servers log under its own directory (regen.fleet.commands.run_dir).
    logs = sorted(config.work_dir.glob("runs/*/logs/server-*.log"))
    counts = [int(n) for p in logs for n in _SERVED.findall(p.read_text())]
    if len(logs) != len(config.engine.gpus) or len(counts) < len(logs):
        raise SystemExit(f"live_gate: a server of {config.work_dir} did not log its count")
    return sum(counts)


def _generation_seconds(config: RegenConfig) -> float:
    """The generation stage's own wall (progress.json's `elapsed_s`: the canary, the shards
    and the commits), without the launch, the final audit and Prefect around them."""
    progress = json.loads((Path(config.output) / "progress.json").read_text())
    return float(progress["elapsed_s"])


def _request_seconds(config: RegenConfig) -> float:
    """The mean wall time of a request of the run (its rows' `latency_s`)."""
    rows = read_committed(LocalStorage(Path(config.output))).collect()
    return float(rows["latency_s"].mean() or 0.0)  # type: ignore[arg-type]


def _run(config: RegenConfig) -> tuple[Any, float, float, int]:
    """The flow's final state, its wall seconds, the seconds to its audit report (its last
    write), the requests its emulators served."""
    from flows.regenerate import regenerate_completions

    start, began = time.perf_counter(), time.time()
    state = regenerate_completions(config, return_state=True)
    wall = time.perf_counter() - start
    report = Path(config.output) / "report" / "audit.json"
    return state, wall, report.stat().st_mtime - began, _served(config)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def measure(args: argparse.Namespace, case: Case, root: Path, lines: CanaryLines) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    slots = args.servers * args.slots
    root.mkdir(parents=True)
    incident_prompts = root / "incident.jsonl"
    clean_prompts = root / "clean.jsonl"
    write_prompts(incident_prompts, case.incident_prompts)
    write_prompts(clean_prompts, case.clean_prompts)

    bad = _config(root / "incident", incident_prompts, args, case, [INCIDENT], gate=True)
    lines.take()
    state, seconds, _, served = _run(bad)
    lines.take()
    # Judged by the record the stop leaves, not by the wording of the state message.
    record = read_stop_record(LocalStorage(Path(bad.output)))
    if not state.is_failed() or record is None:
        raise SystemExit(f"live_gate: the incident was not stopped by the gate: {state}")
    canary = bad.generation.canary_prompts

    clean: dict[str, list[float]] = {"with": [], "without": []}
    work: dict[str, list[float]] = {"with": [], "without": []}
    generation: dict[str, list[float]] = {"with": [], "without": []}
    served_clean: dict[str, list[int]] = {"with": [], "without": []}
    request_s: list[float] = []
    behind: list[int | None] = []
    for k in range(case.repeats):
        # The order flips every repeat, so neither kind always runs on a fresher machine.
        for kind in ("with", "without") if k % 2 == 0 else ("without", "with"):
            run_root = root / f"clean-{k}-{kind}"
            # Each repeat draws its own answers, the same with and without the gate: the same
            # work, and the last answers to end a run (the order of a run's tail) vary.
            config = _config(run_root, clean_prompts, args, case, [], gate=kind == "with", seed=k)
            lines.take()
            done, wall, to_report, count = _run(config)
            if not done.is_completed():
                raise SystemExit(f"live_gate: a clean run ({kind} the gate) ended {done}")
            if kind == "with":
                behind.append(lines.take())
            clean[kind].append(wall)
            work[kind].append(to_report)
            generation[kind].append(_generation_seconds(config))
            served_clean[kind].append(count)
            request_s.append(_request_seconds(config))

    # The launch's requests: a clean run without the gate sends every prompt once, beside them
    # (a hedge's second copy of a straggler adds one: the fewest is the launch's own).
    launch_requests = min(served_clean["without"]) - case.clean_prompts
    beyond = record.prompts_sent - canary
    pairs = list(zip(generation["with"], generation["without"], strict=True))
    median = {kind: _median(times) for kind, times in clean.items()}
    stage = {kind: _median(times) for kind, times in generation.items()}
    reported = {kind: _median(times) for kind, times in work.items()}
    return {
        "case": case.name,
        "title": case.title,
        "emulator": case.emulator,
        "prompts": {"incident": case.incident_prompts, "clean": case.clean_prompts},
        "repeats": case.repeats,
        "slots": slots,
        "canary_prompts": canary,
        "mean_request_seconds": round(statistics.mean(request_s), 3),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "incident_fault": INCIDENT,
        "seconds_to_stop": round(seconds, 2),
        "stopped_stage": record.stage,
        "stopped_checks": [
            {"check": c.check, "figure": c.figure, "fail": c.fail} for c in record.checks
        ],
        "prompts_sent_by_dispatcher": record.prompts_sent,
        "sent_beyond_canary": beyond,
        "sent_beyond_canary_waves": round(beyond / slots, 3),
        "sent_share_at_stop": round(record.prompts_sent / case.incident_prompts, 4),
        "incident_requests_served": served,
        "launch_requests": launch_requests,
        "served_beyond_canary": served - launch_requests - canary,
        "clean_rows_behind_canary": behind,
        "clean_waves_behind_canary": [None if n is None else round(n / slots, 3) for n in behind],
        "clean_seconds_with_gate": [round(s, 2) for s in clean["with"]],
        "clean_seconds_without_gate": [round(s, 2) for s in clean["without"]],
        "clean_overhead_ratio": round(median["with"] / median["without"] - 1, 4),
        "clean_seconds_to_report_with_gate": [round(s, 2) for s in work["with"]],
        "clean_seconds_to_report_without_gate": [round(s, 2) for s in work["without"]],
        "clean_to_report_overhead_ratio": round(reported["with"] / reported["without"] - 1, 4),
        "generation_seconds_with_gate": [round(s, 2) for s in generation["with"]],
        "generation_seconds_without_gate": [round(s, 2) for s in generation["without"]],
        "generation_overhead_ratio": round(stage["with"] / stage["without"] - 1, 4),
        # Each repeat's pair (the same answers): the median of their ratios.
        "generation_overhead_paired": round(_median([w / o - 1 for w, o in pairs]), 4),
        "generation_overhead_seconds": round(stage["with"] - stage["without"], 2),
        # Each prompt reaches a server once with the gate too: the canary's rows are committed
        # in their shards, not sent again.
        "clean_requests_with_gate": served_clean["with"],
        "clean_requests_without_gate": served_clean["without"],
    }


def print_table(result: dict[str, Any]) -> None:
    servers, slots = result["servers"], result["slots_per_server"]
    table = Table(
        title=f"live gate, the real flow on {servers} emulators x {slots} slots "
        f"({servers * slots} slots, a wave)"
    )
    for column in ("run", "prompts", "requests", "seconds", "figures"):
        table.add_column(column, justify="right")
    for case in result["cases"]:
        load = case["load_average_1m"]
        table.add_row(
            f"[bold]{case['title']}[/bold]",
            "",
            "",
            f"{case['mean_request_seconds']:.2f}",
            f"a request's mean seconds; machine load {load[0]:.1f} then {load[1]:.1f} "
            f"(1-min average, {os.cpu_count()} cores)",
        )
        first, *others = case["stopped_checks"]
        table.add_row(
            f"incident {case['incident_fault']}, gate on",
            f"{case['prompts']['incident']:,}",
            f"{case['incident_requests_served']:,} ({case['launch_requests']} launch)",
            f"{case['seconds_to_stop']:.2f}",
            f"stopped at the {case['stopped_stage']}: {first['check']} {pct(first['figure'])} "
            f"(fail at {pct(first['fail'])}) and {len(others)} more checks; sent "
            f"{case['prompts_sent_by_dispatcher']:,} ({case['sent_share_at_stop']:.1%}): "
            f"{case['canary_prompts']} canary + {case['sent_beyond_canary']:,} beyond = "
            f"{case['sent_beyond_canary_waves']:.2f} waves (servers' count: "
            f"{case['served_beyond_canary']:,} beyond)",
        )
        waves = [w for w in case["clean_waves_behind_canary"] if w is not None]
        for kind in ("with", "without"):
            stage = case[f"generation_seconds_{kind}_gate"]
            served = sorted(set(case[f"clean_requests_{kind}_gate"]))
            extra = (
                "; behind the canary before its verdict: "
                + ", ".join(f"{w:.2f}" for w in waves)
                + " waves"
                if kind == "with" and waves
                else ""
            )
            table.add_row(
                f"clean, {kind} the gate: generation",
                f"{case['prompts']['clean']:,}",
                ", ".join(f"{n:,}" for n in served),
                f"{_median(stage):.2f}",
                "median of " + ", ".join(f"{s:.2f}" for s in stage) + extra,
            )
        table.add_row(
            "generation stage overhead",
            "",
            "",
            f"{case['generation_overhead_seconds']:+.2f}",
            f"{case['generation_overhead_ratio']:+.1%} median with / without the gate "
            f"(target <= 2 %); {case['generation_overhead_paired']:+.1%} the median repeat's",
        )
        walls = {k: case[f"clean_seconds_{k}_gate"] for k in ("with", "without")}
        report = {k: case[f"clean_seconds_to_report_{k}_gate"] for k in ("with", "without")}
        table.add_row(
            "clean, the flow's wall",
            "",
            "",
            f"{_median(walls['with']):.2f} / {_median(walls['without']):.2f}",
            f"{case['clean_overhead_ratio']:+.1%} median with / without; to its audit report "
            f"{_median(report['with']):.2f} / {_median(report['without']):.2f} s, "
            f"{case['clean_to_report_overhead_ratio']:+.1%}",
        )
    Console(width=170).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5000, help="prompts of the incident run")
    parser.add_argument("--clean-prompts", type=int, default=2000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16, help="requests in flight per server")
    parser.add_argument("--repeats", type=int, default=5, help="clean runs of each kind")
    parser.add_argument(
        "--cases", help="emulator, gpu or both (default: both; the smoke, emulator)"
    )
    parser.add_argument(
        "--gpu-time-scale", type=float, default=1.0,
        help="the gpu case's wall seconds per simulated second (250 tok/s a request)",
    )  # fmt: skip
    parser.add_argument(
        "--gpu-clean-prompts", type=int, default=640, help="the gpu case's clean runs (waves)"
    )
    parser.add_argument("--gpu-repeats", type=int, default=3)
    parser.add_argument(
        "--smoke", action="store_true",
        help="600 incident and 300 clean prompts, 2 servers, once; the emulator case alone "
        "(the gpu case is the same runs at another time scale), unless --cases says",
    )  # fmt: skip
    args = parser.parse_args()
    if args.cases is None:
        args.cases = "emulator" if args.smoke else "emulator,gpu"
    if args.smoke:
        args.prompts, args.clean_prompts, args.servers, args.repeats = 600, 300, 2, 1
        args.gpu_time_scale, args.gpu_clean_prompts, args.gpu_repeats = 0.05, 300, 1
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    cases = {
        "emulator": Case(
            "emulator", "emulator speed (the rehearsal's time scale 0.01)", {},
            args.prompts, args.clean_prompts, args.repeats,
        ),
        "gpu": Case(
            "gpu", f"GPU proportion (time scale {args.gpu_time_scale:g}: long requests)",
            {"time_scale": args.gpu_time_scale}, args.prompts, args.gpu_clean_prompts,
            args.gpu_repeats,
        ),
    }  # fmt: skip
    unknown = set(names) - set(cases)
    if unknown or not names:
        parser.error(f"--cases: emulator, gpu or both, not {args.cases!r}")

    from flows.cli import prefect_env

    prefect_env()
    from prefect.testing.utilities import prefect_test_harness

    lines = CanaryLines()
    measured = []
    with (
        prefect_test_harness(server_startup_timeout=120),
        tempfile.TemporaryDirectory(prefix="regen-live-gate-") as tmp,
    ):
        for name in names:
            measured.append(measure(args, cases[name], Path(tmp) / name, lines))
    result = {
        "servers": args.servers,
        "slots_per_server": args.slots,
        "cpu_count": os.cpu_count(),
        "cases": measured,
        "smoke": args.smoke,
    }
    print_table(result)
    path = results_path("live_gate", smoke=args.smoke)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
