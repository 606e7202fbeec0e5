"""Chaos: kill -9 `regen rehearse` at random moments, rerun, and count what the crash cost.

Each trial starts a rehearsal, SIGKILLs the flow process (its emulators, in their own
sessions, are orphaned as a crashed node would leave them) before the fleet, while it starts
or, mostly, between shard commits, then reruns the same command to completion. A trial
resumed OK when the rerun exits 0 with every input id exactly once (read through the
manifests), no manifest committed before the kill rewritten, none of the killed run's
servers alive or holding its port, and no process of either run left running: every
descendant of the killed run (emulators, Prefect's temporary API server, anything else) and
of the rerun is counted by kind.

By default each run uses ephemeral Prefect as a user's `regen rehearse` does (one
PREFECT_HOME for all, so only the first run sets up the database), so a kill can orphan
Prefect's temporary server; `--prefect server` shares one `prefect server` instead, and a
trial then pays no ephemeral Prefect start. `--smoke` is one mid-generation trial.

    python benches/chaos.py [--trials 20] [--seed 7] [--prompts 120] [--prefect ephemeral]
                            [--smoke]
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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # regen, support

from benches._common import results_path
from regen.rehearsal import bundled
from regen.storage import LocalStorage
from support.chaos import (
    ChaosRun,
    ProcessMark,
    Reaper,
    descendants,
    input_ids,
    leftovers,
    local_marks,
    reaping,
    rewritten,
    server_records,
    start_rehearsal,
    surviving_servers,
    wait_until,
    write_chaos_config,
    write_prompt_subset,
)
from support.dataset import dataset_ids, manifest_keys
from support.prefect import prefect_env, prefect_server

SHARD_SIZE = 20
KINDS = ("emulator", "prefect", "other")


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
        config=write_chaos_config(base / "regen.yaml", work, shard_size=SHARD_SIZE),
        out=str(base / "out"),
        work_dir=work,
        prompts=prompts,
    )
    expected = input_ids(prompts)
    # Whatever goes wrong below (a wait that raises, a Ctrl-C, a rerun that hangs), every
    # process and server of both runs is killed on the way out.
    with reaping(work) as reaper:
        proc = reaper.started(start_rehearsal(run, env, base, base / "killed.log"))
        moment = _kill_moment(phase, rng, proc, run, -(-len(expected) // SHARD_SIZE))
        killed_procs = reaper.note(descendants(proc.pid))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        records = reaper.servers()
        marks = local_marks(Path(run.out)) if Path(run.out, "shards").is_dir() else {}

        started = time.monotonic()
        rc, rerun_procs = _run_watching(run, env, base, base / "rerun.log", reaper)
        resume_s = time.monotonic() - started
        orphans = surviving_servers(records, timeout_s=5.0)
        left = leftovers(killed_procs + rerun_procs, timeout_s=5.0)
        log = (base / "rerun.log").read_text()
        reaped = re.search(r"stopped (\d+) orphan server", log)
        reaped_prefect = re.search(r"stopped (\d+) orphan Prefect server", log)
    ids = dataset_ids(LocalStorage(Path(run.out)))
    lost, doubled = ids.lost(expected), ids.doubled()
    changed = rewritten(marks, local_marks(Path(run.out)))
    bad = lost or doubled or orphans or left or changed or ids.missing_data
    return {
        "trial": index,
        "killed_at": moment,
        "committed_at_kill": len(marks),
        "servers_at_kill": len(records),
        "processes_at_kill": _by_kind(killed_procs),
        "reaped_by_rerun": int(reaped.group(1)) if reaped else 0,
        "prefect_reaped_by_rerun": int(reaped_prefect.group(1)) if reaped_prefect else 0,
        "rerun_rc": rc,
        "resume_s": round(resume_s, 2),
        "ids_lost": len(lost),
        "ids_doubled": len(doubled),
        "orphans": len(orphans),
        "processes_left": _by_kind(left),
        "rewritten": len(changed),
        "missing_data": len(ids.missing_data),
        "resumed_ok": rc == 0 and not bad,
    }


def _cell(value: object) -> str:
    """Counts by kind as `emulator/prefect/other`, to keep the table narrow."""
    if isinstance(value, dict):
        return "/".join(str(value[k]) for k in KINDS)
    return str(value)


def _by_kind(marks: list[ProcessMark]) -> dict[str, int]:
    return {kind: sum(m.kind == kind for m in marks) for kind in KINDS}


def _run_watching(
    run: ChaosRun, env: dict[str, str], cwd: Path, log: Path, reaper: Reaper
) -> tuple[int, list[ProcessMark]]:
    """Run to the end, noting every process it starts, so what it leaves can be counted."""
    proc = reaper.started(start_rehearsal(run, env, cwd, log))
    seen: dict[tuple[int, float], ProcessMark] = {}
    deadline = time.monotonic() + 400
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update({(m.pid, m.started): m for m in reaper.note(descendants(proc.pid))})
        reaper.servers()
        time.sleep(0.25)
    if proc.poll() is None:
        proc.kill()
    return proc.wait(), list(seen.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=120, help="First N sample prompts.")
    parser.add_argument("--keep", action="store_true", help="Keep the trial directories.")
    parser.add_argument("--prefect", choices=["ephemeral", "server"], default="ephemeral")
    parser.add_argument("--smoke", action="store_true", help="one mid-generation trial")
    parser.add_argument(
        "--prefect-home", type=Path, help="reuse this PREFECT_HOME (its database is set up)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.prompts = 1, 60
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
        phases = ["gen"] if args.smoke else _phases(rng, args.trials)
        with ExitStack() as stack:
            if args.prefect == "server":
                home = args.prefect_home or root / "prefect-home"
                server = stack.enter_context(prefect_server(home, 240))
                env = {**server.env, "PYTHONUNBUFFERED": "1"}
            else:
                env = prefect_env(args.prefect_home or root / "prefect-home")
                env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
            for index, phase in enumerate(phases):
                row = trial(index, phase, rng, root, env, prompts)
                rows.append(row)
                console.print(row)
    finally:
        if args.keep:
            console.print(f"trial directories kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    table = Table(title=f"chaos: {args.trials} kill -9 trials, {args.prompts} prompts")
    columns = ["trial", "killed_at", "servers_at_kill", "reaped_by_rerun"]
    columns += ["prefect_reaped_by_rerun", "resume_s", "ids_lost", "ids_doubled", "orphans"]
    columns += ["processes_left", "rewritten", "resumed_ok"]
    for name in columns:
        header = name.replace("_by_rerun", "")
        table.add_column(f"{header} (emu/pf/other)" if name == "processes_left" else header)
    for row in rows:
        table.add_row(*(_cell(row[name]) for name in columns))
    console.print(table)
    result = {
        "trials": len(rows),
        "resumed_ok": sum(r["resumed_ok"] for r in rows),
        "ids_lost": sum(r["ids_lost"] for r in rows),
        "ids_doubled": sum(r["ids_doubled"] for r in rows),
        "orphans": sum(r["orphans"] for r in rows),
        "processes_left": {k: sum(r["processes_left"][k] for r in rows) for k in KINDS},
        "prefect_servers_reaped": sum(r["prefect_reaped_by_rerun"] for r in rows),
        "shards_rewritten": sum(r["rewritten"] for r in rows),
        "mean_resume_s": round(sum(r["resume_s"] for r in rows) / max(len(rows), 1), 2),
        "seed": args.seed,
        "prompts": args.prompts,
        "prefect": args.prefect,
        "smoke": args.smoke,
        "per_trial": rows,
    }
    results_path("chaos", smoke=args.smoke).write_text(json.dumps(result, indent=2) + "\n")
    summary = {k: v for k, v in result.items() if k != "per_trial"}
    console.print(summary)
    return 0 if result["resumed_ok"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
