"""Fleet chaos: a run's servers broken mid-run as a GPU node breaks them, and what it healed.

The kinds of fault (benches/chaos.py runs them, tests/test_benches.py its smoke):

- `server kill`: one server's process group SIGKILLed (a CUDA error, the OOM killer): it is
  relaunched and the run completes;
- `server hang`: one server's group SIGSTOPped (a stuck scheduler): judged hung after
  `engine.relaunch.hang_s`, killed and relaunched;
- `fleet kill`: every server killed at once: each is relaunched;
- `fleet gone`: every server killed and its port held as it dies, so no relaunch can bind:
  the run stops in one line (`fleet gone: ...`), and a rerun completes the dataset;
- `abort share`: one server cuts a share of its answers (`--emu-fault abort=0.3`): each is
  retried, none stored;
- `401 after start`: one server refuses the key after its first N chats (`--emu-fault
  unauthorized-after=N`, a key rotated under it): the run stops at once in one line naming the
  key's source, and a rerun (the key right again) completes the dataset;
- `clean`: no fault, the run the others' generation time is set against.

A trial is one or more legs on one output, each a run of `regen rehearse` (or `regen run` on
two real CPU SGLang servers), the last one completing the dataset. Each leg is watched
throughout: every process it starts (relaunched servers included), its progress.json every
0.2 s (rows generated while a server was out), its PID and key files. The healing is read from
`report/fleet.json`: each relaunch's `back_at` against the moment of the fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from regen.dataset import read_committed
from regen.fleet.orphans import pid_files
from regen.storage import LocalStorage
from support.chaos import (
    ChaosRun,
    ProcessMark,
    Reaper,
    descendants,
    leftovers,
    surviving_servers,
    wait_until,
    write_chaos_config,
)
from support.dataset import dataset_ids, manifest_keys, read_progress
from support.emulator import hold_port

KINDS = (
    "clean", "server kill", "server hang", "fleet kill", "fleet gone", "abort share",
    "401 after start",
)  # fmt: skip
STOPS = {"fleet gone": "fleet gone: ", "401 after start": "answered 401"}
"""The kinds whose run must stop, and what its one line must say."""
PROCESS_KINDS = ("emulator", "prefect", "other")
STOP_LINE = re.compile(r"^regen: run failed: (.*)$", re.M)
KEY_CHANGED = "API key changed (emulated fault unauthorized-after)"
HANG_S = 5.0
"""engine.relaunch.hang_s of every trial: a stopped server is judged hung in seconds."""
GUARD_S = 1800.0
"""A hang guard on one leg (a real-engine leg takes minutes); no figure depends on it."""


@dataclass(frozen=True)
class Leg:
    """One run of a trial: its kind of fault and any further emulator faults by server."""

    kind: str
    faults: dict[int, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """What a trial runs on: emulators under `regen rehearse`, or (`model` set) two real CPU
    SGLang servers under `regen run`, as tests/engine/ drives them."""

    prompts: Path
    rows: int
    shard_size: int = 20
    time_scale: float = 0.1
    concurrency: int = 4
    model: Path | None = None
    """The tiny model (support/tiny_model.py): the real engine instead of emulators."""

    @property
    def shards(self) -> int:
        return -(-self.rows // self.shard_size)

    @property
    def engine(self) -> str:
        return "emulator" if self.model is None else "sglang"

    def argv(self, config: Path, out: Path, work: Path) -> list[str]:
        if self.model is not None:
            return [sys.executable, "-m", "flows.cli", "run", "--config", str(config)]
        return ChaosRun(config, str(out), work, prompts=self.prompts).argv()

    def write_config(self, path: Path, out: Path, work: Path, leg: Leg) -> Path:
        """The leg's config: fast relaunches (1 s backoff; on emulators a hang in HANG_S),
        progress every 0.25 s, and the leg's emulator faults."""
        relaunch: dict[str, Any] = {"backoff_s": 1.0}
        if self.model is None:  # a real CPU server on a loaded machine keeps the default
            relaunch["hang_s"] = HANG_S
        if leg.kind == "fleet gone":
            relaunch["max_restarts"] = 1  # each relaunch fails (its port is held): one is enough
        faults = {k: list(v) for k, v in leg.faults.items()}
        if leg.kind == "abort share":
            faults.setdefault(0, []).append("abort=0.3")
        if leg.kind == "401 after start":
            faults.setdefault(1, []).append(f"unauthorized-after={self._chats_until_mid_run()}")
        if self.model is not None:
            from support.engine import engine_config  # the real engine's config only here

            data = engine_config(
                path.parent, self.model, self.prompts, _free_ports(),
                engine={"relaunch": relaunch},
                generation={"canary_prompts": 24, "progress_interval_s": 0.25},
            )  # fmt: skip
            data.update(output=str(out), work_dir=str(work), shard_size=self.shard_size)
            data["concurrency_per_server"] = self.concurrency
        else:
            write_chaos_config(
                path, work, shard_size=self.shard_size, time_scale=self.time_scale,
                concurrency=self.concurrency,
            )  # fmt: skip
            data = yaml.safe_load(path.read_text())
            data["engine"]["relaunch"] = relaunch
            data["engine"]["emulator"]["server_faults"] = faults
            # A micro-benchmark of a few chats: they count towards unauthorized-after.
            data["engine"]["bench"] = {"concurrency": 1, "max_tokens": 16, "budget_s": 0.1}
            data["generation"]["progress_interval_s"] = 0.25
        path.write_text(yaml.safe_dump(data))
        return path

    def _chats_until_mid_run(self) -> int:
        """unauthorized-after for server-1, which counts its own chats: its launch probe and
        a micro-benchmark of a few, then about two fifths of its half of the rows."""
        return 6 + self.rows // 5


def _free_ports() -> int:
    from regen.machine.ports import quiet_port_range

    return quiet_port_range(2)


@dataclass
class Watch:
    """Everything a running leg is seen doing, from a thread of its own: its processes, its
    progress (time, rows generated), when a server first refused the key."""

    proc: subprocess.Popen[bytes]
    reaper: Reaper
    out: Path
    work: Path
    seen: dict[tuple[int, float], ProcessMark] = field(default_factory=dict)
    progress: list[tuple[float, int]] = field(default_factory=list)
    key_changed_at: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._run, name="fleet-chaos-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        storage = LocalStorage(self.out)
        while not self._stop.is_set():
            marks = self.reaper.note(descendants(self.proc.pid))
            self.seen.update({(m.pid, m.started): m for m in marks})
            self.reaper.servers()
            with contextlib.suppress(OSError, ValueError, AssertionError, KeyError):
                self.progress.append((time.time(), int(read_progress(storage)["done"])))
            if self.key_changed_at is None and any(
                KEY_CHANGED in p.read_text(errors="replace")
                for p in self.work.glob("runs/*/logs/server-*.log")
            ):
                self.key_changed_at = time.time()
            self._stop.wait(0.2)

    def done_at(self, at: float) -> int | None:
        """Rows generated by `at` (the last sample before it)."""
        before = [done for t, done in self.progress if t <= at]
        return before[-1] if before else None


def run_leg(
    leg: Leg, target: Target, base: Path, index: int, env: dict[str, str], reaper: Reaper
) -> dict[str, Any]:
    """One run of a trial with its fault, measured; the dataset is judged by `judge`."""
    out, work = base / "out", base / "work"
    config = target.write_config(base / f"leg-{index}.yaml", out, work, leg)
    log = base / f"leg-{index}.log"
    storage = LocalStorage(out)
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            target.argv(config, out, work), cwd=base, env=env, stdin=subprocess.DEVNULL,
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    reaper.started(proc)
    fault_at: float | None = None
    victims: list[dict[str, Any]] = []
    holders: list[socket.socket] = []
    with Watch(proc, reaper, out, work) as watch:
        try:
            if leg.kind in ("server kill", "server hang", "fleet kill", "fleet gone"):
                fault_at, victims, holders = _break(leg.kind, target, proc, reaper, storage)
            rc = _wait(proc)
        finally:
            for holder in holders:
                holder.close()
        ended = time.time()
    said = log.read_text(errors="replace")
    row: dict[str, Any] = {
        "kind": leg.kind + "".join(f" +{f}" for fs in leg.faults.values() for f in fs),
        "exit_code": rc,
        "at_rows": _at(fault_at, watch),
        "traceback": "Traceback" in said,
        **_healing(out, victims, fault_at, watch),
        **_leftovers(watch, reaper, work),
    }
    stops = STOP_LINE.findall(said)
    if leg.kind in STOPS:
        began = fault_at if leg.kind == "fleet gone" else watch.key_changed_at
        row["stop_s"] = round(ended - began, 1) if began is not None else None
        row["one_line"] = len(stops) == 1 and STOPS[leg.kind] in stops[0]
        row["stop_line"] = stops[0] if stops else ""
        if leg.kind == "401 after start":
            row["one_line"] = row["one_line"] and "(the key is " in stops[0]
        row["_stopped_ok"] = rc == 1 and row["one_line"] and not row["traceback"]
    else:
        row["_stopped_ok"] = rc == 0 and not stops and not row["traceback"]
    return row


def _break(
    kind: str, target: Target, proc: subprocess.Popen[bytes], reaper: Reaper, storage: LocalStorage
) -> tuple[float | None, list[dict[str, Any]], list[socket.socket]]:
    """Once a third of the shards are committed, break the fleet as `kind` says; returns when
    (Unix time), which servers, and the sockets that hold their ports."""
    third = max(1, target.shards // 3)

    def ready() -> bool:
        return len(reaper.servers()) >= 2 and len(manifest_keys(storage)) >= third

    if not wait_until(ready, proc, GUARD_S, poll_s=0.05) or proc.poll() is not None:
        return None, [], []
    records = sorted(reaper.servers(), key=lambda r: int(r["port"]))
    victims = records[-1:] if kind.startswith("server") else records
    how = signal.SIGSTOP if kind == "server hang" else signal.SIGKILL
    at = time.time()
    for record in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(record["pgid"]), how)
    holders = [hold_port(int(r["port"])) for r in victims] if kind == "fleet gone" else []
    return at, victims, holders


def _wait(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -1


def _at(fault_at: float | None, watch: Watch) -> int | None:
    """Rows generated when the fault landed (a kill, or the first 401)."""
    moment = fault_at if fault_at is not None else watch.key_changed_at
    return None if moment is None else watch.done_at(moment)


def _healing(
    out: Path, victims: list[dict[str, Any]], fault_at: float | None, watch: Watch
) -> dict[str, Any]:
    """From report/fleet.json: seconds from the fault until the last victim was back in the
    dispatcher, the rows generated meanwhile, relaunches and cut answers, and from the final
    progress.json the generation's seconds."""
    try:
        fleet = json.loads((out / "report" / "fleet.json").read_text())
    except (OSError, ValueError):
        fleet = []
    try:
        gen_s: float | None = round(float(read_progress(LocalStorage(out))["elapsed_s"]), 1)
    except (OSError, ValueError, AssertionError, KeyError):
        gen_s = None
    figures: dict[str, Any] = {
        "relaunches": sum(r.get("relaunches", 0) for r in fleet),
        "cut_answers": sum(r.get("cut_answers", 0) for r in fleet),
        "gen_s": gen_s,
        "heal_s": None,
        "rows_while_out": None,
    }
    if fault_at is None or not victims:
        return figures
    ports = {int(v["port"]) for v in victims}
    backs = []
    for row in fleet:
        if row.get("port") not in ports:
            continue
        back = [r["back_at"] for r in row.get("relaunch_log", []) if r.get("back_at")]
        back = [b for b in back if b >= fault_at]
        backs.append(min(back) if back else None)
    if backs and None not in backs:
        last = max(b for b in backs if b is not None)
        figures["heal_s"] = round(last - fault_at, 1)
        before, after = watch.done_at(fault_at), watch.done_at(last)
        if before is not None and after is not None:
            figures["rows_while_out"] = after - before
    return figures


def _leftovers(watch: Watch, reaper: Reaper, work: Path) -> dict[str, Any]:
    """What the leg left running or on disk once it ended: processes by kind, servers alive
    or holding their port, PID files and key files."""
    left = leftovers(list(watch.seen.values()), timeout_s=5.0)
    return {
        "processes_left": {k: sum(m.kind == k for m in left) for k in PROCESS_KINDS},
        "servers_left": len(surviving_servers(reaper.servers(), timeout_s=5.0)),
        "pid_files_left": len(pid_files(work)),
        "key_files_left": len(list(work.glob("runs/*/secrets/*"))),
    }


def judge(rows: list[dict[str, Any]], out: Path, expected: list[str]) -> None:
    """Fill in each row of a trial the dataset its last leg left: ids lost and doubled,
    aborted answers stored; and whether the row is ok."""
    ids = dataset_ids(LocalStorage(out))
    lost, doubled = ids.lost(expected), ids.doubled()
    aborted = aborted_rows(out)
    for row in rows:
        row.update(
            ids_lost=len(lost), ids_doubled=len(doubled), aborted_stored=aborted,
            missing_data=len(ids.missing_data),
        )  # fmt: skip
        bad = lost or doubled or aborted or ids.missing_data or sum(row["processes_left"].values())
        bad = bad or row["servers_left"] or row["pid_files_left"] or row["key_files_left"]
        row["ok"] = bool(row.pop("_stopped_ok")) and not bad


def aborted_rows(out: Path) -> int:
    """Rows stored with an answer the server cut (finish_reason abort, in any turn)."""
    data = read_committed(LocalStorage(out)).scan()
    answered = data.filter(pl.col("error").is_null())
    last = answered.filter(pl.col("finish_reason") == "abort").select(pl.len()).collect().item()
    turns = (
        answered.select(pl.col("turns").list.eval(pl.element().struct.field("finish_reason")))
        .explode("turns")
        .filter(pl.col("turns") == "abort")
        .select(pl.len())
        .collect()
        .item()
    )
    return int(max(last, turns))


def run_trial(
    legs: list[Leg],
    target: Target,
    base: Path,
    env: dict[str, str],
    reaping: Callable[[Path], contextlib.AbstractContextManager[Reaper]],
    expected: list[str],
) -> list[dict[str, Any]]:
    """Legs on one output; a stopping kind's leg is followed by a clean rerun (its row says
    the rerun's exit code), so the trial ends with the dataset complete. One row per fault."""
    base.mkdir(parents=True)
    plan = list(legs)
    if plan and plan[-1].kind in STOPS:
        plan.append(Leg("rerun"))
    rows: list[dict[str, Any]] = []
    with reaping(base / "work") as reaper:
        for index, leg in enumerate(plan):
            row = run_leg(leg, target, base, index, env, reaper)
            if leg.kind == "rerun":
                previous = rows[-1]
                previous["rerun_rc"] = row["exit_code"]
                previous["_stopped_ok"] = previous["_stopped_ok"] and row["_stopped_ok"]
                previous["processes_left"] = {
                    k: previous["processes_left"][k] + row["processes_left"][k]
                    for k in PROCESS_KINDS
                }
                for key in ("servers_left", "pid_files_left", "key_files_left"):
                    previous[key] += row[key]
                continue
            rows.append(row)
    judge(rows, base / "out", expected)
    return rows
