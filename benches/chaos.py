"""Chaos: kill -9 `regen rehearse` at random moments, rerun, and count what the crash cost;
the same for a terminal's Ctrl-C and for a second run on the same output.

A kill -9 trial starts a rehearsal, SIGKILLs the flow process (its emulators, in their own
sessions, are orphaned as a crashed node would leave them) before the fleet, while it starts
or, mostly, between shard commits, then reruns the same command to completion. A trial
resumed OK when the rerun exits 0 with every input id exactly once (read through the
manifests), no manifest committed before the kill rewritten or planned again, none of the
killed run's servers alive or holding its port, and no process of either run left running:
every descendant of the killed run (emulators, Prefect's temporary API server, anything else)
and of the rerun is counted by kind.

A SIGINT trial sends SIGINT to the run's whole process group at the same moments, as a
terminal's Ctrl-C does (the run and, with ephemeral Prefect, its temporary API server): the
run must exit 130 within its 20 s watchdog, say how to resume, leave no server and no process
(counted at its exit, before a rerun could reap them), then a rerun completes the dataset. A
second-run trial starts another `regen rehearse` on the same `--out` from its own work dir
while the first holds the output (planning, launching or generating): it must exit 1 in
seconds with the one line naming the first (its pid), generate nothing, and the first must
finish the dataset whole. Per kind the bench prints a table and the totals: trials, ids lost,
ids doubled, shards generated twice, processes left, exit codes and seconds.

The fleet's faults (benches/_fleet.py, support/fleet_chaos.py) break the servers instead of
regen: one killed (SIGKILL) or hung (SIGSTOP) mid-run, every one killed (with relaunch able to
bring them back, and `fleet gone`, where it cannot), one cutting a share of its answers, one
refusing the key after the start; each beside a clean run of the same size. Per kind: ids lost
and doubled, aborted answers stored, processes and files left, seconds until the server was
back (report/fleet.json), rows generated meanwhile, the generation's slowdown against the
clean run, and for the kinds that must stop, the one line and the seconds to it. `--engine
sglang` runs the clean and server-kill kinds on two real CPU SGLang servers (.venv-sglang, the
tiny model, support/engine.py's config) instead of emulators, and nothing else: slow.

By default each run uses ephemeral Prefect as a user's `regen rehearse` does (one
PREFECT_HOME for all, so only the first run sets up the database), so a kill can orphan
Prefect's temporary server; `--prefect server` shares one `prefect server` instead, and a
trial then pays no ephemeral Prefect start. `--smoke` is one chain on 80 prompts (a second run
refused while the first runs, the first Ctrl-C'd, its rerun killed -9, a rerun to completion)
and one fleet run on 120 (a server killed while the other cuts a share of its answers).

    python benches/chaos.py [--trials 20] [--sigint-trials N] [--second-trials N] [--seed 7]
                            [--prompts 120] [--prefect ephemeral] [--smoke]
                            [--fleet-trials 3] [--fleet-kinds KIND,...] [--fleet-prompts 240]
                            [--engine emulator|sglang]
"""

from __future__ import annotations

import argparse
import contextlib
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # regen, support

from benches import _fleet as fleet
from benches._common import results_path
from regen.rehearsal import bundled
from regen.storage import LocalStorage
from regen.storage.output_lease import read_lease
from support.chaos import (
    ChaosRun,
    ManifestMark,
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
from support.fleet_chaos import Target
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
    return chain(index, [("kill9", phase)], rng, root, env, prompts)[0]


def chain(
    index: int,
    steps: list[tuple[str, str]],
    rng: random.Random,
    root: Path,
    env: dict[str, str],
    prompts: Path,
    second: str | None = None,
) -> list[dict[str, Any]]:
    """Runs on one output: each of `steps` (`kill9` or `sigint`, at a phase) stops one run, then
    a last run goes to completion; `second` (a phase) starts a second run on the same output,
    from another work dir, during the first run. One row per stop and per second run, each
    judged on the dataset the last run leaves. A trial of the full bench is one step or one
    second run; `--smoke` chains one of each, so each new kind costs a stop, not a run."""
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
    num_shards = -(-len(expected) // SHARD_SIZE)
    rows: list[dict[str, Any]] = []
    # Marks taken when each row's run stopped, checked against the dataset at the end.
    marks_at: list[dict[str, ManifestMark]] = []
    watched: list[ProcessMark] = []  # every process of every run, judged after the last one
    # Whatever goes wrong below (a wait that raises, a Ctrl-C, a rerun that hangs), every
    # process and server of every run is killed on the way out.
    with ExitStack() as stack:
        reaper = stack.enter_context(reaping(work))
        for attempt, (how, phase) in enumerate([*steps, ("complete", "")]):
            log = base / f"run-{attempt}.log"
            this = run
            if second is not None and attempt == 0:
                # Slower emulators while the second run starts (a minute and more on a loaded
                # machine, with its own ephemeral Prefect): the first still holds the output
                # when the second asks. Emulator speed is no part of the run's fingerprint.
                slow = write_chaos_config(
                    base / "first.yaml", work, shard_size=SHARD_SIZE, time_scale=SLOW_TIME_SCALE
                )
                this = replace(run, config=slow)
            proc = reaper.started(start_rehearsal(this, env, base, log))
            if second is not None and attempt == 0:
                other = stack.enter_context(reaping(base / "work-2"))
                row, marks = _second_run(second, rng, proc, run, base, env, other, num_shards)
                watched += reaper.note(descendants(proc.pid)) + row.pop("_processes")
                rows.append({"trial": index, **row})
                marks_at.append(marks)
            if how == "complete":
                started = time.monotonic()
                rc, seen = _watch(proc, reaper)
                resume_s = time.monotonic() - started
                watched += seen
                last_log = log.read_text(errors="replace")
                break
            moment = _kill_moment(phase, rng, proc, run, num_shards)
            stopped = reaper.note(descendants(proc.pid))
            records = reaper.servers()
            row = {**_stop(how, proc, records, stopped, log), "_position": attempt}
            watched += stopped
            marks_at.append(local_marks(Path(run.out)) if Path(run.out, "shards").is_dir() else {})
            rows.append({"trial": index, "at": moment, **row})
        records = reaper.servers()
        orphans = surviving_servers(records, timeout_s=5.0)
        left = leftovers(watched, timeout_s=5.0)
    ids = dataset_ids(LocalStorage(Path(run.out)))
    final = local_marks(Path(run.out)) if Path(run.out, "shards").is_dir() else {}
    lost, doubled = ids.lost(expected), ids.doubled()
    logs = [(base / f"run-{n}.log").read_text(errors="replace") for n in range(len(steps) + 1)]
    reaped = re.search(r"stopped (\d+) orphan server", last_log)
    reaped_prefect = re.search(r"stopped (\d+) orphan Prefect server", last_log)
    for row, marks in zip(rows, marks_at, strict=True):
        changed = rewritten(marks, final)
        row.update(
            rerun_rc=rc,
            resume_s=round(resume_s, 2),
            ids_lost=len(lost),
            ids_doubled=len(doubled),
            rewritten=len(changed),
            missing_data=len(ids.missing_data),
        )
        row["generated_twice"] = len(changed) + row.pop("_second_generated", 0)
        if row["kind"] == "kill -9":
            row.update(
                committed_at_kill=len(marks),
                reaped_by_rerun=int(reaped.group(1)) if reaped else 0,
                prefect_reaped_by_rerun=int(reaped_prefect.group(1)) if reaped_prefect else 0,
                orphans=len(orphans),
                processes_left=_by_kind(left),
            )
        else:
            # A Ctrl-C or a refused run must leave nothing for a rerun to reap: counted when it
            # stopped (`_stop`, `_second_run`), plus anything of the trial still alive now.
            row["orphans"] += len(orphans)
            row["processes_left"] = {
                k: row["processes_left"][k] + n for k, n in _by_kind(left).items()
            }
        row["generated_twice"] += _replanned(logs, len(marks), num_shards, row)
        bad = lost or doubled or row["orphans"] or sum(row["processes_left"].values())
        bad = bad or changed or ids.missing_data or row["generated_twice"]
        stopped_ok = row.pop("_stopped_ok", True)
        row["ok"] = rc == 0 and not bad and stopped_ok
        if row["kind"] == "kill -9":
            row["resumed_ok"] = row["ok"]
    return rows


def _replanned(logs: list[str], committed: int, num_shards: int, row: dict[str, Any]) -> int:
    """Shards the run after this row's stop planned beyond those not committed at the stop: a
    committed shard generated again (the plan's headline says what it will generate)."""
    if row["kind"] == "second run":
        return 0
    position = row.pop("_position", None)
    if position is None or position + 1 >= len(logs):
        return 0
    planned = PLANNED.search(logs[position + 1])
    return max(0, int(planned.group(2)) - (num_shards - committed)) if planned else 0


PLANNED = re.compile(r"(\d+) committed, (\d+) to generate")


def _stop(
    how: str,
    proc: subprocess.Popen,
    records: list[dict[str, Any]],
    stopped: list[ProcessMark],
    log: Path,
) -> dict[str, Any]:
    """kill -9 the flow process alone (its servers are orphaned for the rerun to reap), or
    SIGINT its whole process group as a terminal's Ctrl-C does and time the exit."""
    if how == "kill9":
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return {
            "kind": "kill -9",
            "exit_code": proc.returncode,
            "servers_at_kill": len(records),
            "processes_at_kill": _by_kind(stopped),
        }
    sent = time.monotonic()
    with contextlib.suppress(ProcessLookupError):  # ended meanwhile: its exit code says so
        os.killpg(proc.pid, signal.SIGINT)  # its own session: pgid == pid
    try:
        rc: int | None = proc.wait(timeout=SIGINT_WAIT_S)
    except subprocess.TimeoutExpired:
        rc = None  # hung: killed below, and the trial fails
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stop_s = time.monotonic() - sent
    said = log.read_text(errors="replace")
    finished = rc == 0 and "audit:" in said  # the signal landed after the run's end
    return {
        "kind": "SIGINT to group",
        "exit_code": rc,
        "stop_s": round(stop_s, 2),
        "resume_line": "regen: interrupted by SIGINT" in said,
        "traceback": "Traceback" in said,
        "servers_at_signal": len(records),
        "orphans": len(surviving_servers(records, timeout_s=5.0)),
        "processes_left": _by_kind(leftovers(stopped, timeout_s=5.0)),
        "_stopped_ok": finished or (rc == 130 and stop_s < SIGINT_WITHIN_S),
    }


SLOW_TIME_SCALE = 1.0
"""The first run's emulator time scale in a second-run trial: a GPU's pace, 20x the others'
(at 0.25 a CI machine under load started the second run after the first had finished)."""
SIGINT_WAIT_S = 120.0
"""How long a Ctrl-C'd run is given before it counts as hung (the issue saw > 120 s)."""
SIGINT_WITHIN_S = 20.0
"""The run's own watchdog ends the unwinding after 20 s; slower is a failure."""


def _second_run(
    phase: str,
    rng: random.Random,
    first: subprocess.Popen,
    run: ChaosRun,
    base: Path,
    env: dict[str, str],
    reaper: Reaper,
    num_shards: int,
) -> tuple[dict[str, Any], dict[str, ManifestMark]]:
    """Start a second `regen rehearse` on the first's output, from its own work dir, once the
    first holds the output (`lease`) or at a random shard commit (`gen`), and run it to its
    end: it must be refused in seconds, in one line naming the first, generating nothing."""
    storage = LocalStorage(Path(run.out))

    def held() -> bool:
        record = read_lease(storage) if Path(run.out, "lease").is_dir() else None
        return record is not None and record.holder is not None

    wait_until(held, first, 180, poll_s=0.05)
    if phase == "gen":
        target = rng.randint(1, max(1, num_shards // 2))
        wait_until(lambda: len(manifest_keys(storage)) >= target, first, 180, poll_s=0.05)
    moment = "finished" if first.poll() is not None else _where(run, num_shards)
    marks = local_marks(Path(run.out)) if Path(run.out, "shards").is_dir() else {}
    work = base / "work-2"
    second = replace(
        run,
        config=write_chaos_config(base / "second.yaml", work, shard_size=SHARD_SIZE),
        work_dir=work,
    )
    log = base / "second.log"
    started = time.monotonic()
    rc, seen = _watch(reaper.started(start_rehearsal(second, env, base, log)), reaper)
    took = time.monotonic() - started
    said = log.read_text(errors="replace")
    line = next((_unboxed(s) for s in said.splitlines() if HELD in s), "")
    flat = " ".join(_unboxed(s) for s in said.splitlines())
    planned = PLANNED.search(said)
    refused = rc == 1 and f"{HELD}: pid {first.pid} on " in flat and "Traceback" not in said
    return {
        "kind": "second run",
        "at": moment,
        "exit_code": rc,
        "refusal_s": round(took, 2),
        "holder_line": line,
        "names_holder": f"pid {first.pid} on " in flat,
        "orphans": len(surviving_servers(reaper.servers(), timeout_s=5.0)),
        "processes_left": _by_kind(leftovers(seen, timeout_s=5.0)),
        "_second_generated": int(planned.group(2)) if planned else 0,
        "_stopped_ok": refused or moment == "finished",
        "_processes": seen,
    }, marks


HELD = "output held by another run"


def _unboxed(line: str) -> str:
    """A line of a printed table without its borders and padding."""
    return " ".join(line.strip().strip("│┃").split())


def _where(run: ChaosRun, num_shards: int) -> str:
    committed = len(manifest_keys(LocalStorage(Path(run.out))))
    if committed:
        return f"gen {committed}/{num_shards}"
    return "fleet" if server_records(run.work_dir) else "startup"


def _cell(value: object) -> str:
    """Counts by kind as `emulator/prefect/other`, to keep the table narrow."""
    if isinstance(value, dict):
        return "/".join(str(value[k]) for k in KINDS)
    return str(value)


def _by_kind(marks: list[ProcessMark]) -> dict[str, int]:
    return {kind: sum(m.kind == kind for m in marks) for kind in KINDS}


def _watch(proc: subprocess.Popen, reaper: Reaper) -> tuple[int, list[ProcessMark]]:
    """Wait for `proc` to end, noting every process it starts, so what it leaves can be
    counted."""
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
    parser.add_argument("--trials", type=int, default=20, help="kill -9 trials")
    parser.add_argument("--sigint-trials", type=int, help="Ctrl-C trials (default: --trials)")
    parser.add_argument("--second-trials", type=int, help="second-run trials (default: --trials)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompts", type=int, default=120, help="First N sample prompts.")
    parser.add_argument("--keep", action="store_true", help="Keep the trial directories.")
    parser.add_argument("--prefect", choices=["ephemeral", "server"], default="ephemeral")
    parser.add_argument("--smoke", action="store_true", help="one chained trial of each kind")
    parser.add_argument(
        "--prefect-home", type=Path, help="reuse this PREFECT_HOME (its database is set up)"
    )
    parser.add_argument("--fleet-trials", type=int, default=3, help="trials of each fleet kind")
    parser.add_argument(
        "--fleet-kinds", default=",".join(fleet.KINDS), help="comma-separated fleet kinds"
    )
    parser.add_argument("--fleet-prompts", type=int, default=240, help="prompts of a fleet run")
    parser.add_argument(
        "--engine", choices=["emulator", "sglang"], default="emulator",
        help="sglang: the fleet's clean and server-kill kinds on two real CPU servers, only",
    )  # fmt: skip
    args = parser.parse_args()
    sigint_trials = args.trials if args.sigint_trials is None else args.sigint_trials
    second_trials = args.trials if args.second_trials is None else args.second_trials
    fleet_kinds = [k.strip() for k in args.fleet_kinds.split(",") if k.strip()]
    if unknown := set(fleet_kinds) - set(fleet.KINDS):
        parser.error(f"unknown fleet kind(s) {sorted(unknown)}; known: {', '.join(fleet.KINDS)}")
    if args.smoke:
        args.trials, sigint_trials, second_trials, args.prompts = 1, 1, 1, 80
        args.fleet_prompts = 120  # six shards: the kill lands after two, the heal before the end
    if args.engine == "sglang":
        args.trials = sigint_trials = second_trials = 0
        fleet_kinds = [k for k in fleet_kinds if k in fleet.ENGINE_KINDS]
    # Stopped with SIGTERM, the bench still stops its Prefect server and any trial's servers.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rng = random.Random(args.seed)
    console = Console(width=160)
    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="regen-chaos-"))
    try:
        prompts = write_prompt_subset(
            bundled("sample_prompts.jsonl"), root / "prompts.jsonl", args.prompts
        )
        plans = _plans(rng, args.smoke, args.trials, sigint_trials, second_trials)
        with ExitStack() as stack:
            if args.prefect == "server":
                home = args.prefect_home or root / "prefect-home"
                server = stack.enter_context(prefect_server(home, 240))
                env = {**server.env, "PYTHONUNBUFFERED": "1"}
            else:
                env = prefect_env(args.prefect_home or root / "prefect-home")
                env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
            for index, (steps, second) in enumerate(plans):
                for row in chain(index, steps, rng, root, env, prompts, second):
                    rows.append(row)
                    console.print(row)
            target = _fleet_target(args.engine, root, args.fleet_prompts)
            fleet_plans = fleet.plans(fleet_kinds, args.fleet_trials, args.smoke)
            fleet_rows = fleet.run(fleet_plans, target, root, env, console)
    finally:
        if args.keep:
            console.print(f"trial directories kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    for kind, columns in TABLES.items():
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            console.print(
                _table(f"{kind}: {len(mine)} trials, {args.prompts} prompts", columns, mine)
            )
    kinds = {kind: _summary([r for r in rows if r["kind"] == kind]) for kind in TABLES}
    kinds = {kind: figures for kind, figures in kinds.items() if figures["trials"]}
    if kinds:
        console.print(
            _table("chaos by kind of trial", SUMMARY, [{"kind": k, **v} for k, v in kinds.items()])
        )
    fleet_kinds_seen = fleet.summary(fleet_rows)
    if fleet_rows:
        where = f"{args.fleet_prompts} prompts, {target.engine}"
        console.print(fleet.table(f"fleet faults: {len(fleet_rows)} trials, {where}", fleet_rows))
        console.print(fleet.summary_table(f"fleet faults by kind ({where})", fleet_kinds_seen))
    kill9 = [r for r in rows if r["kind"] == "kill -9"]
    result = {
        "trials": len(kill9),
        "resumed_ok": sum(r["resumed_ok"] for r in kill9),
        "ids_lost": sum(r["ids_lost"] for r in kill9),
        "ids_doubled": sum(r["ids_doubled"] for r in kill9),
        "orphans": sum(r["orphans"] for r in kill9),
        "processes_left": {k: sum(r["processes_left"][k] for r in kill9) for k in KINDS},
        "prefect_servers_reaped": sum(r["prefect_reaped_by_rerun"] for r in kill9),
        "shards_rewritten": sum(r["rewritten"] for r in kill9),
        "mean_resume_s": round(sum(r["resume_s"] for r in kill9) / max(len(kill9), 1), 2),
        "kinds": kinds,
        "seed": args.seed,
        "prompts": args.prompts,
        "prefect": args.prefect,
        "smoke": args.smoke,
        # The smoke chains its kinds on one output: their data figures are one dataset's.
        "chained": args.smoke,
        "per_trial": rows,
        "fleet": {
            "engine": args.engine,
            "prompts": args.fleet_prompts,
            "shard_size": target.shard_size,
            "kinds": fleet_kinds_seen,
            "per_trial": fleet_rows,
        },
        "load": os.getloadavg(),
    }
    results_path("chaos", smoke=args.smoke).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["ok"] for r in [*rows, *fleet_rows]) else 1


def _fleet_target(engine: str, root: Path, prompts: int) -> Target:
    """Emulators over the first `prompts` sample prompts, or two real CPU SGLang servers over
    the tiny model and `prompts` one-turn prompts (two requests a server, so it lasts)."""
    if engine == "emulator":
        path = write_prompt_subset(
            bundled("sample_prompts.jsonl"), root / "fleet-prompts.jsonl", prompts
        )
        return Target(prompts=path, rows=prompts)
    from support.engine import MISSING, build_tiny_model, env_ready, write_prompts

    if not env_ready():
        raise SystemExit(MISSING)
    path = root / "engine-prompts.jsonl"
    write_prompts(path, single=prompts, multi=0, too_long=0)
    model = build_tiny_model(root / "tiny-model")
    return Target(prompts=path, rows=prompts, concurrency=2, model=model)


TABLES = {
    "kill -9": ["trial", "at", "servers_at_kill", "reaped_by_rerun", "prefect_reaped_by_rerun",
                "resume_s", "ids_lost", "ids_doubled", "generated_twice", "orphans",
                "processes_left", "ok"],
    "SIGINT to group": ["trial", "at", "exit_code", "stop_s", "resume_line", "traceback",
                        "resume_s", "ids_lost", "ids_doubled", "generated_twice", "orphans",
                        "processes_left", "ok"],
    "second run": ["trial", "at", "exit_code", "refusal_s", "names_holder", "ids_lost",
                   "ids_doubled", "generated_twice", "orphans", "processes_left", "ok"],
}  # fmt: skip
SUMMARY = ["kind", "trials", "ok", "ids_lost", "ids_doubled", "generated_twice",
           "processes_left", "exit_codes", "seconds"]  # fmt: skip


def _plans(
    rng: random.Random, smoke: bool, kill9: int, sigint: int, second: int
) -> list[tuple[list[tuple[str, str]], str | None]]:
    """Each trial's stops and second run. The smoke is one chain: a second run refused while
    the first runs, that run Ctrl-C'd, its rerun killed -9, a rerun to completion."""
    if smoke:
        return [([("sigint", "gen"), ("kill9", "gen")], "lease")]
    plans: list[tuple[list[tuple[str, str]], str | None]] = []
    plans += [([("kill9", phase)], None) for phase in _phases(rng, kill9)]
    plans += [([("sigint", phase)], None) for phase in _phases(rng, sigint)]
    # Half as soon as the first run holds the output (it is planning, staging, launching),
    # half while it generates.
    plans += [([], "lease" if n % 2 else "gen") for n in range(second)]
    return plans


def _table(title: str, columns: list[str], rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for name in columns:
        header = name.replace("_by_rerun", "")
        table.add_column(f"{header} (emu/pf/other)" if name == "processes_left" else header)
    for row in rows:
        table.add_row(*(_cell(row[name]) for name in columns))
    return table


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind: the counts the issue asks for, the exit codes seen, and the seconds that kind
    is about (kill -9: the rerun's; SIGINT: signal to exit; a second run: start to refusal)."""
    seconds = {"kill -9": "resume_s", "SIGINT to group": "stop_s", "second run": "refusal_s"}
    times = [r[seconds[r["kind"]]] for r in rows]
    return {
        "trials": len(rows),
        "ok": sum(r["ok"] for r in rows),
        "ids_lost": sum(r["ids_lost"] for r in rows),
        "ids_doubled": sum(r["ids_doubled"] for r in rows),
        "generated_twice": sum(r["generated_twice"] for r in rows),
        "processes_left": {k: sum(r["processes_left"][k] for r in rows) for k in KINDS},
        "exit_codes": ",".join(str(c) for c in sorted({r["exit_code"] for r in rows}, key=str)),
        "seconds": f"{min(times):.1f}-{max(times):.1f}" if times else "",
    }


if __name__ == "__main__":
    sys.exit(main())
