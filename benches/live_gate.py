"""Live-gate bench: what the gate saves on a bad run and costs on a healthy one, in the real flow.

Every run is `regenerate_completions(config, return_state=True)`, the flow `regen rehearse`
runs, called in this process under one `prefect_test_harness` (its API server is up before
the first run, so no run's wall time carries Prefect's start). Each run gets a rehearsal
config (`regen.rehearsal.rehearsal_config`: emulators, the engine's defaults otherwise) with
its own output and work dir, so none is a rerun of another.

- incident: every server with `empty-answer=0.87` on `--prompts` synthetic prompts.
  `seconds_to_stop` is the wall time from calling the flow to its final (Failed) state:
  provision, stage, plan, launch, canary, stop, teardown and the report of what was kept.
  `sent_share_at_stop` is the requests the emulators served (summed from their own logs,
  `Served N requests` at shutdown) minus the launch's own requests (readiness probes and the
  fleet micro-benchmark), over the planned prompts. The launch's requests are measured on the
  clean runs without the gate, which send every prompt exactly once on a fleet of the same
  size and settings: served - prompts. The dispatcher's own count (`prompts_sent` in
  `report/stopped.json`) is reported beside it as a cross-check, with the check figures
  that stopped the run.
- clean: no fault, `--clean-prompts` prompts, the gate on (defaults: canary 256 prompts,
  `audit.live: stop`) and off (`generation.canary_prompts: 0`, `audit.live: off`),
  alternated (the order flips every repeat) `--repeats` times each. Both kinds store each
  committed shard's audit summary (the final audit merges them) and merge it into the running
  figures of progress.json; "off" saves the canary and the judging (stop, quarantine). The
  shards' rows fill the slots behind the canary while it runs and is judged (their commits
  wait for its verdict), so what "with" adds is the audit's CPU, not idle servers.
  Every run has `--slots` requests in flight per server (16, the fleet issue 30 measured).
  `clean_overhead_ratio` is median(with) / median(without) - 1 of the flow's wall time;
  `clean_overhead_ratio_fastest` compares the fastest of each. Target <= 2 %, median of 5.
  `generation_overhead_ratio` compares the generation stage alone (progress.json's
  `elapsed_s`), where the canary's cost lies, free of the launch's and the audit's noise.
  A flow's wall is rounded up to Prefect's heartbeat: on exit the flow joins its heartbeat
  thread, which sleeps in 1 s slices (prefect/flow_engine.py `_send_heartbeats`), so every
  run's wall ends on a whole second of it and a few tenths of a second become 0 or 1 s.
  `clean_to_report_overhead_ratio` therefore also compares the wall from the call to the
  flow's last write (report/audit.json; these runs export nothing), which that join follows.

    .venv/bin/python benches/live_gate.py [--prompts 5000] [--clean-prompts 2000]
        [--servers 4] [--slots 16] [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
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
from regen.figures import pct
from regen.rehearsal import rehearsal_config
from regen.storage import LocalStorage

INCIDENT = "empty-answer=0.87"
GATE_OFF = {"generation": {"canary_prompts": 0}, "audit": {"live": "off"}}
_SERVED = re.compile(r"Shutting down\. Served (\d+) requests\.")


def _config(
    root: Path, prompts: Path, args: argparse.Namespace, faults: list[str], *, gate: bool
) -> RegenConfig:
    """A rehearsal config of its own output and work dir under `root`."""
    root.mkdir(parents=True)
    data: dict[str, Any] = {"work_dir": str(root / "work"), "concurrency_per_server": args.slots}
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


def _run(config: RegenConfig) -> tuple[Any, float, float, int]:
    """The flow's final state, its wall seconds, the seconds to its audit report (its last
    write: see `_work_seconds`), the requests its emulators served."""
    from flows.regenerate import regenerate_completions

    start, began = time.perf_counter(), time.time()
    state = regenerate_completions(config, return_state=True)
    wall = time.perf_counter() - start
    report = Path(config.output) / "report" / "audit.json"
    return state, wall, report.stat().st_mtime - began, _served(config)


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    incident_prompts = root / "incident.jsonl"
    clean_prompts = root / "clean.jsonl"
    write_prompts(incident_prompts, args.prompts)
    write_prompts(clean_prompts, args.clean_prompts)

    bad = _config(root / "incident", incident_prompts, args, [INCIDENT], gate=True)
    state, seconds, _, served = _run(bad)
    # Judged by the record the stop leaves, not by the wording of the state message.
    record = read_stop_record(LocalStorage(Path(bad.output)))
    if not state.is_failed() or record is None:
        raise SystemExit(f"live_gate: the incident was not stopped by the gate: {state}")

    clean: dict[str, list[float]] = {"with": [], "without": []}
    work: dict[str, list[float]] = {"with": [], "without": []}
    generation: dict[str, list[float]] = {"with": [], "without": []}
    served_clean: dict[str, list[int]] = {"with": [], "without": []}
    for k in range(args.repeats):
        # The order flips every repeat, so neither kind always runs on a fresher machine.
        for kind in ("with", "without") if k % 2 == 0 else ("without", "with"):
            run_root = root / f"clean-{k}-{kind}"
            config = _config(run_root, clean_prompts, args, [], gate=kind == "with")
            done, wall, to_report, count = _run(config)
            if not done.is_completed():
                raise SystemExit(f"live_gate: a clean run ({kind} the gate) ended {done}")
            clean[kind].append(wall)
            work[kind].append(to_report)
            generation[kind].append(_generation_seconds(config))
            served_clean[kind].append(count)

    launch = {n - args.clean_prompts for n in served_clean["without"]}
    if len(launch) != 1:
        raise SystemExit(f"live_gate: the launches served different counts: {sorted(launch)}")
    launch_requests = launch.pop()
    sent = served - launch_requests
    sent_once = set(served_clean["with"]) == {args.clean_prompts + launch_requests}
    median = {kind: statistics.median(times) for kind, times in clean.items()}
    fastest = {kind: min(times) for kind, times in clean.items()}
    stage = {kind: statistics.median(times) for kind, times in generation.items()}
    reported = {kind: statistics.median(times) for kind, times in work.items()}
    return {
        "prompts": {"incident": args.prompts, "clean": args.clean_prompts},
        "servers": args.servers,
        "slots_per_server": args.slots,
        "repeats": args.repeats,
        "incident_fault": INCIDENT,
        "sent_share_at_stop": round(sent / args.prompts, 4),
        "seconds_to_stop": round(seconds, 2),
        "stopped_stage": record.stage,
        "stopped_checks": [
            {"check": c.check, "figure": c.figure, "fail": c.fail} for c in record.checks
        ],
        "incident_requests_served": served,
        "launch_requests": launch_requests,
        "prompts_sent_by_dispatcher": record.prompts_sent,
        "clean_seconds_with_gate": [round(s, 2) for s in clean["with"]],
        "clean_seconds_without_gate": [round(s, 2) for s in clean["without"]],
        "clean_overhead_ratio": round(median["with"] / median["without"] - 1, 4),
        "clean_overhead_ratio_fastest": round(fastest["with"] / fastest["without"] - 1, 4),
        "clean_seconds_to_report_with_gate": [round(s, 2) for s in work["with"]],
        "clean_seconds_to_report_without_gate": [round(s, 2) for s in work["without"]],
        "clean_to_report_overhead_ratio": round(reported["with"] / reported["without"] - 1, 4),
        "generation_seconds_with_gate": [round(s, 2) for s in generation["with"]],
        "generation_seconds_without_gate": [round(s, 2) for s in generation["without"]],
        "generation_overhead_ratio": round(stage["with"] / stage["without"] - 1, 4),
        # Each prompt reaches a server once with the gate too: the canary's rows are committed
        # in their shards, not sent again.
        "clean_requests_with_gate": served_clean["with"],
        "clean_requests_without_gate": served_clean["without"],
        "each_prompt_sent_once": sent_once,
        "smoke": args.smoke,
    }


def print_table(result: dict[str, Any]) -> None:
    prompts, servers = result["prompts"], result["servers"]
    slots = result["slots_per_server"]
    table = Table(title=f"live gate, the real flow on {servers} emulators x {slots} slots")
    for column in ("run", "prompts", "requests", "seconds", "figures"):
        table.add_column(column, justify="right")
    first, *others = result["stopped_checks"]
    table.add_row(
        f"incident {result['incident_fault']}, gate on",
        f"{prompts['incident']:,}",
        f"{result['incident_requests_served']:,} ({result['launch_requests']} launch)",
        f"{result['seconds_to_stop']:.2f}",
        f"stopped at the {result['stopped_stage']}: {first['check']} {pct(first['figure'])} "
        f"(fail at {pct(first['fail'])}) and {len(others)} more checks; "
        f"sent {result['sent_share_at_stop']:.1%} "
        f"(dispatcher: {result['prompts_sent_by_dispatcher']:,})",
    )
    for kind in ("with", "without"):
        times = result[f"clean_seconds_{kind}_gate"]
        served = sorted(set(result[f"clean_requests_{kind}_gate"]))
        table.add_row(
            f"clean, {kind} the gate",
            f"{prompts['clean']:,}",
            ", ".join(f"{n:,}" for n in served) + f" ({result['launch_requests']} launch)",
            f"{statistics.median(times):.2f}",
            "median of " + ", ".join(f"{s:.2f}" for s in times),
        )
    table.add_row(
        "clean overhead",
        "",
        "",
        "",
        f"{result['clean_overhead_ratio']:+.1%} median, "
        f"{result['clean_overhead_ratio_fastest']:+.1%} fastest (target <= 2 %)",
    )
    report = {k: result[f"clean_seconds_to_report_{k}_gate"] for k in ("with", "without")}
    table.add_row(
        "clean, flow to its audit report",
        "",
        "",
        f"{statistics.median(report['with']):.2f} / {statistics.median(report['without']):.2f}",
        f"{result['clean_to_report_overhead_ratio']:+.1%} median with / without the gate: "
        + "; ".join(", ".join(f"{s:.2f}" for s in report[k]) for k in ("with", "without")),
    )
    stage = {k: result[f"generation_seconds_{k}_gate"] for k in ("with", "without")}
    table.add_row(
        "generation stage alone",
        "",
        "",
        f"{statistics.median(stage['with']):.2f} / {statistics.median(stage['without']):.2f}",
        f"{result['generation_overhead_ratio']:+.1%} median with / without the gate: "
        + "; ".join(", ".join(f"{s:.2f}" for s in stage[k]) for k in ("with", "without")),
    )
    Console(width=150).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5000, help="prompts of the incident run")
    parser.add_argument("--clean-prompts", type=int, default=2000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16, help="requests in flight per server")
    parser.add_argument("--repeats", type=int, default=5, help="clean runs of each kind")
    parser.add_argument(
        "--smoke", action="store_true", help="600 incident and 300 clean prompts, 2 servers, once"
    )
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.clean_prompts, args.servers, args.repeats = 600, 300, 2, 1

    from flows.cli import prefect_env

    prefect_env()
    from prefect.testing.utilities import prefect_test_harness

    with (
        prefect_test_harness(server_startup_timeout=120),
        tempfile.TemporaryDirectory(prefix="regen-live-gate-") as tmp,
    ):
        result = measure(args, Path(tmp))
    print_table(result)
    path = results_path("live_gate", smoke=args.smoke)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
