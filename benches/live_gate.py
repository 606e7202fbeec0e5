"""Live-gate bench: what the canary costs on a healthy run and what it saves on a bad one.

Everything runs through the library pieces a run uses, without Prefect: the prompts are
loaded, planned and cached (`regen.prompts`, `regen.dataset`), the fleet is launched and torn
down by `regen.fleet` (real emulator processes), one `Dispatcher` feeds every shard, shards
commit through `commit_shard`, and the canary is `regen.canary` (sample, store, shard merge,
stop record).

- incident: every server with `empty-answer=0.87`. The canary is sent first and audited; the
  gate fails it, the stop record is written and the fleet torn down. Figures: the share of
  the planned prompts the servers received (counted at their own /metrics, minus the launch
  probes) and the seconds from launch to the stop; beside them, what the same fleet takes to
  generate the whole plan without a canary (what a run without the gate spends before its
  final audit fails).
- clean: a healthy fleet generates the plan with the canary and without it, alternately,
  `--repeats` times each into fresh outputs; the overhead ratio compares the fastest of each
  (with / without - 1); the estimate `clean_overhead_estimate` times the canary phase
  alone (send, wait for its longest answer, audit) less what its rows cost at full speed.

The gate here runs the audit's row-level checks over the canary rows at the default
thresholds; the run's own gate (regen.audit's per-shard summaries) decides the same way.

    .venv/bin/python benches/live_gate.py [--prompts 5000] [--servers 4] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.audit.loss_mask import load_model_template
from regen.audit.quality import (
    empty_answer_check,
    empty_thinking_check,
    repetition_check,
    think_leak_check,
    truncation_checks,
)
from regen.audit.result import Check
from regen.audit.summary import AuditSettings, audit_rows
from regen.audit.thresholds import AuditConfig
from regen.canary import (
    StopRecord,
    canary_key,
    canary_sample,
    generate_shard_rows,
    read_canary,
    run_canary,
    write_stop_record,
)
from regen.client import Dispatcher
from regen.config import RegenConfig, parse_config
from regen.dataset import cache_prompts, commit_shard, plan_shards, prompts_for_shard
from regen.fleet import Fleet, build_server_commands, generate_api_key, launch_fleet
from regen.ports import free_port_range
from regen.prompts import load_prompts
from regen.rehearsal import bundled
from regen.schema import row_schema
from regen.storage import LocalStorage

INCIDENT = "empty-answer=0.87"


def _config(work: Path, prompts: Path, servers: int, faults: list[str]) -> RegenConfig:
    return parse_config(
        {
            "model": {
                "source": str(bundled("emulator-model")),
                "served_name": "qwen3-emu",
                "stage": False,
            },
            "prompts": str(prompts),
            "output": str(work / "out"),
            "work_dir": str(work / "work"),
            "shard_size": 100,
            "engine": {
                "kind": "emulator",
                "python": sys.executable,
                "gpus": list(range(servers)),
                "base_port": free_port_range(servers, random.randint(20000, 60000)),
                "max_running_requests": 16,
                "startup_timeout_s": 60,
                "emulator": {
                    "load_s": 0.2,
                    "time_scale": 0.002,
                    "reasoning_tokens": "200:4000",
                    "answer_tokens": "20:800",
                    "faults": faults,
                },
            },
        }
    )


def _write_prompts(path: Path, count: int) -> Path:
    lines = (
        json.dumps({"id": f"p{i:06d}", "messages": [{"role": "user", "content": f"q {i}?"}]})
        for i in range(count)
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def _requests(fleet: Fleet) -> int:
    """Requests the servers answered, from their own /metrics (probes included)."""
    total = 0.0
    for endpoint in fleet.endpoints:
        with urllib.request.urlopen(f"{endpoint.url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "sglang:e2e_request_latency_seconds_count":
                    total += sample.value
    return int(total)


def _gate(rows: pl.DataFrame, audit: AuditConfig) -> tuple[list[Check], float]:
    """The failing row-level checks of `rows` and the seconds the audit took."""
    start = time.monotonic()
    # The run's gate judges a summary: the same one here, with no template (no check 10/11).
    settings = AuditSettings(audit, True, load_model_template(None, enable_thinking=True), 0)
    summary = audit_rows(rows, settings)
    checks = [
        empty_answer_check(summary, audit),
        empty_thinking_check(summary, audit, True),
        think_leak_check(summary, audit),
        *truncation_checks(summary, audit),
        repetition_check(summary, audit),
    ]
    return [c for c in checks if c.status == "fail"], time.monotonic() - start


def _generate(
    config: RegenConfig,
    fleet: Fleet,
    output: Path,
    canary_size: int,
    stop_on_fail: bool,
) -> dict[str, float]:
    """Plan, canary, gate, shards: a run's generation stage, timed from before the launch."""
    storage = LocalStorage(output)
    prompt_set = load_prompts(config.prompts)
    plan = plan_shards(prompt_set, config.shard_size)
    cache = cache_prompts(prompt_set, plan, output / "prompts.parquet")
    fingerprint = "b" * 64
    pending = list(range(plan.num_shards))
    before = _requests(fleet)
    start = time.monotonic()
    audit_s = canary_s = 0.0
    with Dispatcher(
        fleet.endpoints,
        api_key=fleet.api_key,
        model=config.model.served_name,
        sampling=config.sampling,
        generation=config.generation,
        concurrency_per_server=config.concurrency,
    ) as dispatcher:
        canary = pl.DataFrame(schema=row_schema())
        if canary_size:
            sample = canary_sample(cache, pending, canary_size)
            canary = run_canary(dispatcher, storage, fingerprint, sample)
            failed, audit_s = _gate(canary, config.audit)
            canary_s = time.monotonic() - start
            if failed and stop_on_fail:
                sent = _requests(fleet) - before
                write_stop_record(
                    storage,
                    StopRecord(
                        fingerprint=fingerprint,
                        stage="canary",
                        rows_audited=canary.height,
                        prompts_sent=sent,
                        prompts_planned=plan.num_rows,
                        checks=failed,
                        canary=canary_key(fingerprint),
                    ),
                )
                return {
                    "seconds": time.monotonic() - start,
                    "sent": sent,
                    "planned": plan.num_rows,
                    "audit_s": audit_s,
                    "canary_s": canary_s,
                    "stopped": 1,
                    "reason_share": failed[0].figure or 0.0,
                }
            canary = read_canary(storage, fingerprint)

        def shard_task(shard: int) -> None:
            rows = prompts_for_shard(cache, shard)
            out = generate_shard_rows(dispatcher, shard, rows, canary)
            commit_shard(storage, shard, out, fingerprint=fingerprint, timings={})

        # Every shard queued at once, as the flow maps them: the dispatcher keeps slots full.
        with ThreadPoolExecutor(max_workers=len(pending)) as pool:
            list(pool.map(shard_task, pending))
    return {
        "seconds": time.monotonic() - start,
        "sent": _requests(fleet) - before,
        "planned": plan.num_rows,
        "audit_s": audit_s,
        "canary_s": canary_s,
        "stopped": 0,
        "reason_share": 0.0,
    }


def _launch(config: RegenConfig, work: Path) -> tuple[Fleet, float]:
    key = generate_api_key()
    commands = build_server_commands(config, config.model.staged_path(), key, work)
    start = time.monotonic()
    return launch_fleet(config, commands, key), start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=5000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--canary", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="clean runs of each kind")
    parser.add_argument("--smoke", action="store_true", help="400 prompts, 2 servers, canary 40")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.servers, args.canary, args.repeats = 400, 2, 40, 1
    with tempfile.TemporaryDirectory(prefix="regen-live-gate-") as tmp:
        root = Path(tmp)
        prompts = _write_prompts(root / "prompts.jsonl", args.prompts)

        bad = _config(root / "bad", prompts, args.servers, [INCIDENT])
        fleet, launched = _launch(bad, root / "bad")
        with fleet:
            stop = _generate(bad, fleet, root / "bad" / "gated", args.canary, stop_on_fail=True)
            stop_from_launch = time.monotonic() - launched
            ungated = _generate(bad, fleet, root / "bad" / "ungated", 0, stop_on_fail=False)

        good = _config(root / "good", prompts, args.servers, [])
        fleet, _ = _launch(good, root / "good")
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "canary": []}
        with fleet:
            # Alternated and repeated: on a shared machine one run's noise exceeds the cost.
            for k in range(args.repeats):
                for name, size in (("plain", 0), ("canary", args.canary)):
                    out = root / "good" / f"{name}-{k}"
                    runs[name].append(_generate(good, fleet, out, size, stop_on_fail=True))
        plain = min(runs["plain"], key=lambda r: r["seconds"])
        canaried = min(runs["canary"], key=lambda r: r["seconds"])
    if not stop["stopped"] or canaried["stopped"]:
        raise SystemExit(f"the gate misjudged: incident {stop}, clean {canaried}")
    if canaried["sent"] != plain["sent"]:
        raise SystemExit(f"canary rows were sent twice: {canaried['sent']} vs {plain['sent']}")

    result = {
        "prompts": args.prompts,
        "servers": args.servers,
        "canary_prompts": args.canary,
        "clean_repeats": args.repeats,
        "sent_share_at_stop": round(stop["sent"] / stop["planned"], 4),
        "seconds_to_stop": round(stop_from_launch, 3),
        "seconds_to_stop_from_generation": round(stop["seconds"], 3),
        "stopped_check_figure": round(stop["reason_share"], 4),
        "ungated_seconds_to_end": round(ungated["seconds"], 3),
        "clean_seconds_without_canary": round(plain["seconds"], 3),
        "clean_seconds_with_canary": round(canaried["seconds"], 3),
        "clean_canary_audit_s": round(canaried["audit_s"], 4),
        "clean_overhead_ratio": round(canaried["seconds"] / plain["seconds"] - 1, 4),
        # The canary's own cost, less noisy than two whole runs: its phase (send, drain, audit)
        # minus what its rows take at the clean run's throughput, over the clean run.
        "clean_canary_phase_s": round(canaried["canary_s"], 3),
        "clean_overhead_estimate": round(
            (canaried["canary_s"] - plain["seconds"] * args.canary / args.prompts)
            / plain["seconds"],
            4,
        ),
        "smoke": args.smoke,
    }
    table = Table(title=f"live gate, {args.prompts:,} prompts, {args.servers} emulators")
    for column in ("run", "prompts sent", "share sent", "seconds", "note"):
        table.add_column(column, justify="right")
    table.add_row(
        f"incident {INCIDENT}, canary {args.canary}",
        f"{stop['sent']:,}",
        f"{result['sent_share_at_stop']:.1%}",
        f"{stop['seconds']:.2f}",
        f"stopped: empty_answer {stop['reason_share']:.1%}; {stop_from_launch:.2f} s from launch",
    )
    table.add_row(
        f"incident {INCIDENT}, no canary",
        f"{ungated['sent']:,}",
        f"{ungated['sent'] / ungated['planned']:.1%}",
        f"{ungated['seconds']:.2f}",
        "all generated; only the final audit would fail",
    )
    table.add_row(
        "clean, no canary",
        f"{plain['sent']:,}",
        "100%",
        f"{plain['seconds']:.2f}",
        f"fastest of {args.repeats}: " + ", ".join(f"{r['seconds']:.2f}" for r in runs["plain"]),
    )
    table.add_row(
        f"clean, canary {args.canary}",
        f"{canaried['sent']:,}",
        "100%",
        f"{canaried['seconds']:.2f}",
        f"overhead {result['clean_overhead_ratio']:+.1%}, canary phase "
        f"{canaried['canary_s']:.2f} s = {result['clean_overhead_estimate']:+.1%} "
        f"(gate audit {canaried['audit_s']:.3f} s); "
        + ", ".join(f"{r['seconds']:.2f}" for r in runs["canary"]),
    )
    Console(width=150).print(table)
    results_path("live_gate", smoke=args.smoke).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
