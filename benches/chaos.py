"""Chaos: kill -9 `regen rehearse` at random moments, rerun, and count what the crash cost.

Each trial starts a rehearsal, SIGKILLs the flow process (its emulators, in their own
sessions, are orphaned as a crashed node would leave them) before the fleet, while it starts
or, mostly, between shard commits, then reruns the same command to completion. A trial
resumed OK when the rerun exits 0 with every input id exactly once (read through the
manifests), no manifest committed before the kill rewritten, and none of the killed run's
servers alive or holding its port. One `prefect server` serves every run, so a trial pays
interpreter and flow start-up but not an ephemeral Prefect start.

    python benches/chaos.py [--trials 20] [--seed 7] [--prompts 120] [--servers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' process tools

from regen.rehearsal import bundled
from regen.storage import LocalStorage
from tests._chaos_helpers import (
    ChaosRun,
    dataset_ids,
    input_ids,
    kill_servers,
    local_marks,
    manifest_keys,
    rewritten,
    server_records,
    start_rehearsal,
    surviving_servers,
    wait_until,
    write_chaos_config,
    write_prompt_subset,
)
from tests._prefect_server import free_port, prefect_server

RESULTS = Path(__file__).parent / "results" / "chaos.json"
SHARD_SIZE = 20


def _phases(rng: random.Random, trials: int) -> list[str]:
    """A tenth each before the fleet, while it starts, and just after the last commit (fleet
    still up); the rest mid-generation. Drawn as shares, not per trial, so that 20 trials
    always hit every phase; the order and the moment within a phase are random."""
    rare = ["startup", "fleet", "last"] * max(1, trials // 10)
    phases = (rare + ["gen"] * trials)[:trials]
    rng.shuffle(phases)
    return phases


def _kill_moment(
    phase: str, rng: random.Random, proc: subprocess.Popen, run: ChaosRun, num_shards: int
) -> str:
    """Wait for a random moment of `phase`; returns where in the run it really landed."""
    storage = LocalStorage(Path(run.out))
    if phase == "startup":
        time.sleep(rng.uniform(1.0, 10.0))  # interpreter, Prefect client, provisioning
    elif phase == "fleet":
        wait_until(lambda: bool(server_records(run.work_dir)), proc, 120)
        time.sleep(rng.uniform(0.0, 1.5))  # servers loading, probe, fleet bench
    elif phase == "last":
        # Every shard committed, the fleet not yet torn down: the rerun has nothing to
        # generate and must still stop the servers.
        wait_until(lambda: len(manifest_keys(storage)) >= num_shards, proc, 180, poll_s=0.02)
    else:
        target = rng.randint(1, num_shards - 1)
        wait_until(lambda: len(manifest_keys(storage)) >= target, proc, 180, poll_s=0.05)
        time.sleep(rng.uniform(0.0, 0.3))
    if proc.poll() is not None:
        return "finished"
    committed = len(manifest_keys(storage)) if Path(run.out, "shards").is_dir() else 0
    if committed:
        fleet = "+fleet" if committed == num_shards and server_records(run.work_dir) else ""
        return f"gen {committed}/{num_shards}{fleet}"
    return "fleet" if server_records(run.work_dir) else "startup"


def trial(
    index: int, phase: str, rng: random.Random, root: Path, env: dict[str, str], prompts: Path
) -> dict[str, Any]:
    """One kill -9 and its rerun, measured."""
    base = root / f"trial-{index:02d}"
    base.mkdir()
    work = base / "work"
    run = ChaosRun(
        config=write_chaos_config(
            base / "regen.yaml", work, shard_size=SHARD_SIZE, base_port=free_port()
        ),
        out=str(base / "out"),
        work_dir=work,
        prompts=prompts,
    )
    expected = input_ids(prompts)
    proc = start_rehearsal(run, env, base, base / "killed.log")
    moment = _kill_moment(phase, rng, proc, run, -(-len(expected) // SHARD_SIZE))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    records = server_records(work)
    marks = local_marks(Path(run.out)) if Path(run.out, "shards").is_dir() else {}

    started = time.monotonic()
    with (base / "rerun.log").open("wb") as log:
        rerun = subprocess.run(
            run.argv(), cwd=base, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=400
        )
    resume_s = time.monotonic() - started
    orphans = surviving_servers(records, timeout_s=5.0)
    reaped = re.search(r"stopped (\d+) orphan server", (base / "rerun.log").read_text())
    kill_servers(records + server_records(work))
    ids = dataset_ids(LocalStorage(Path(run.out)))
    lost, doubled = ids.lost(expected), ids.doubled()
    changed = rewritten(marks, local_marks(Path(run.out)))
    ok = rerun.returncode == 0 and not (lost or doubled or orphans or changed or ids.missing_data)
    return {
        "trial": index,
        "killed_at": moment,
        "committed_at_kill": len(marks),
        "servers_at_kill": len(records),
        "reaped_by_rerun": int(reaped.group(1)) if reaped else 0,
        "rerun_rc": rerun.returncode,
        "resume_s": round(resume_s, 2),
        "ids_lost": len(lost),
        "ids_doubled": len(doubled),
        "orphans": len(orphans),
        "rewritten": len(changed),
        "missing_data": len(ids.missing_data),
        "resumed_ok": ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=120, help="First N sample prompts.")
    parser.add_argument("--keep", action="store_true", help="Keep the trial directories.")
    args = parser.parse_args()
    # Stopped with SIGTERM, the bench still stops its Prefect server and any trial's servers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rng = random.Random(args.seed)
    console = Console(width=140)
    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="regen-chaos-"))
    try:
        prompts = write_prompt_subset(
            bundled("sample_prompts.jsonl"), root / "prompts.jsonl", args.prompts
        )
        with prefect_server(root / "prefect-home", startup_timeout=240) as server:
            env = {**server.env, "PYTHONUNBUFFERED": "1"}
            for index, phase in enumerate(_phases(rng, args.trials)):
                row = trial(index, phase, rng, root, env, prompts)
                rows.append(row)
                console.print(row)
    finally:
        if args.keep:
            console.print(f"trial directories kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    table = Table(title=f"chaos: {args.trials} kill -9 trials, {args.prompts} prompts")
    columns = ["trial", "killed_at", "servers_at_kill", "reaped_by_rerun", "resume_s"]
    columns += ["ids_lost", "ids_doubled", "orphans", "rewritten", "resumed_ok"]
    for name in columns:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*(str(row[name]) for name in columns))
    console.print(table)
    result = {
        "trials": len(rows),
        "resumed_ok": sum(r["resumed_ok"] for r in rows),
        "ids_lost": sum(r["ids_lost"] for r in rows),
        "ids_doubled": sum(r["ids_doubled"] for r in rows),
        "orphans": sum(r["orphans"] for r in rows),
        "shards_rewritten": sum(r["rewritten"] for r in rows),
        "mean_resume_s": round(sum(r["resume_s"] for r in rows) / max(len(rows), 1), 2),
        "seed": args.seed,
        "prompts": args.prompts,
        "per_trial": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    summary = {k: v for k, v in result.items() if k != "per_trial"}
    console.print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
