"""Chaos tools: a `regen rehearse` subprocess to kill, and what a killed run must leave behind.

Shared by tests/test_chaos.py and benches/chaos.py. A rehearsal runs in its own session so
that a signal sent to it reaches only the flow process: its emulators have their own
sessions and must be left orphaned by a kill -9, so that the rerun's reaping is what is
tested. The dataset is read back through support.dataset, as the audit reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import yaml

from regen.dataset import parse_manifest_key
from regen.fleet.orphans import pid_files
from regen.machine.ports import port_is_free


@dataclass(frozen=True)
class ChaosRun:
    """What a chaos rehearsal is: its config file, output, servers and the prompts it reads."""

    config: Path
    out: str
    work_dir: Path
    servers: int = 2
    prompts: Path | None = None

    def argv(self) -> list[str]:
        args = ["rehearse", "--config", str(self.config), "--out", self.out]
        args += ["--servers", str(self.servers)]
        if self.prompts is not None:
            args += ["--prompts", str(self.prompts)]
        return [sys.executable, "-m", "flows.cli", *args]


@dataclass(frozen=True)
class ProcessMark:
    """A process a run started, as it was when seen: PID, start time (PIDs are reused), kind."""

    pid: int
    started: float
    kind: str


def _kind(proc: psutil.Process) -> str:
    cmdline = " ".join(proc.cmdline())
    if "prefect.server.api.server:create_app" in cmdline or " server start" in cmdline:
        return "prefect"
    if "regen.emulator" in cmdline or "sglang" in cmdline:
        return "emulator"
    return "other"


def descendants(pid: int) -> list[ProcessMark]:
    """Every process below `pid` right now: servers, Prefect's temporary API server, helpers."""
    marks = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            marks.append(ProcessMark(child.pid, child.create_time(), _kind(child)))
        except psutil.Error:
            continue  # gone meanwhile: nothing left behind
    return marks


def _same_alive(mark: ProcessMark) -> bool:
    try:
        proc = psutil.Process(mark.pid)
        return proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - mark.started) < 1
    except psutil.Error:
        return False


def leftovers(marks: list[ProcessMark], timeout_s: float = 10.0) -> list[ProcessMark]:
    """Those of `marks` still running after `timeout_s` (the same process, not a reused PID)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [m for m in marks if _same_alive(m)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def kill_leftovers(marks: list[ProcessMark]) -> None:
    """Clean-up after a failed check, so that one trial's processes do not spill into the next."""
    for mark in marks:
        if _same_alive(mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(mark.pid, signal.SIGKILL)


def write_chaos_config(
    path: Path,
    work_dir: Path,
    *,
    shard_size: int = 20,
    time_scale: float = 0.05,
    concurrency: int = 4,
) -> Path:
    """Slow enough emulators that generation spans seconds: a kill can land inside it.

    No base port: each run's rehearsal picks its own free range, below the ephemeral ports.
    """
    data = {
        "work_dir": str(work_dir),
        "shard_size": shard_size,
        "concurrency_per_server": concurrency,
        "engine": {"emulator": {"time_scale": time_scale}},
        # A small canary: the default 256 would generate every sample prompt before the first
        # shard commits, and the kill is meant to land between shard commits.
        "generation": {"canary_prompts": 24},
    }
    path.write_text(yaml.safe_dump(data))
    return path


def write_prompt_subset(source: Path, path: Path, rows: int) -> Path:
    """The first `rows` prompts of `source` (JSONL), for runs that must stay short."""
    pl.read_ndjson(source).head(rows).write_ndjson(path)
    return path


def input_ids(prompts: Path) -> list[str]:
    return pl.read_ndjson(prompts)["id"].to_list()


def start_rehearsal(run: ChaosRun, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """`regen rehearse` in its own session, output to `log`; the caller kills or waits."""
    with log.open("ab") as out:
        return subprocess.Popen(
            run.argv(),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until(
    ready: Callable[[], bool], proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.1
) -> bool:
    """Poll `ready()` until true; False when the process ended or time ran out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return True
        if proc.poll() is not None:
            return ready()
        time.sleep(poll_s)
    return False


def server_records(work_dir: Path) -> list[dict[str, Any]]:
    """The PID files of the servers a run started (read them before killing it)."""
    records = []
    for path in pid_files(work_dir):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # being written right now: the next poll reads it
    return records


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def surviving_servers(records: list[dict[str, Any]], timeout_s: float = 10.0) -> list[str]:
    """Servers of `records` still alive or still holding their port after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [
            f"{r['host']}:{r['port']} pid {r['pid']}"
            for r in records
            if _alive(int(r["pid"])) or not port_is_free(str(r["host"]), int(r["port"]))
        ]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def kill_servers(records: list[dict[str, Any]]) -> None:
    """Clean-up after a failed check: a test must not leave servers to the next one."""
    for record in records:
        if _alive(int(record["pid"])):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(record["pgid"]), signal.SIGKILL)


@dataclass(frozen=True)
class ManifestMark:
    """A committed manifest as it was: its bytes and a modification stamp of its store."""

    content: bytes
    stamp: str


def local_marks(root: Path) -> dict[str, ManifestMark]:
    return {
        f"shards/{p.name}": ManifestMark(p.read_bytes(), str(p.stat().st_mtime_ns))
        for p in sorted((root / "shards").iterdir())
        if parse_manifest_key(f"shards/{p.name}") is not None
    }


def s3_marks(client: Any, bucket: str, prefix: str) -> dict[str, ManifestMark]:
    """S3 has no mtime to preserve but LastModified and the ETag change on every PUT."""
    marks = {}
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/shards/"
    )
    for page in pages:
        for obj in page.get("Contents", []):
            key = obj["Key"].removeprefix(f"{prefix}/")
            if parse_manifest_key(key) is not None:
                body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
                marks[key] = ManifestMark(body, f"{obj['LastModified'].isoformat()} {obj['ETag']}")
    return marks


def rewritten(before: dict[str, ManifestMark], after: dict[str, ManifestMark]) -> list[str]:
    """Manifests committed before that are now gone or differ in bytes or stamp."""
    return sorted(k for k, mark in before.items() if after.get(k) != mark)


class Reaper:
    """Everything one bench trial or test started, killed when it ends, however it ends.

    Servers are found through the PID files under `work_dir` (read at every `servers()` and
    once more at the end, since a run removes them when it stops its fleet), processes through
    the marks noted and the descendants of every run `started`: a trial that raises midway
    leaves nothing running (an emulator has its own session, so killing the run is not enough).
    """

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self._runs: list[subprocess.Popen] = []
        self._servers: dict[int, dict[str, Any]] = {}
        self._marks: dict[tuple[int, float], ProcessMark] = {}

    def started(self, proc: subprocess.Popen) -> subprocess.Popen:
        self._runs.append(proc)
        return proc

    def note(self, marks: list[ProcessMark]) -> list[ProcessMark]:
        self._marks.update({(m.pid, m.started): m for m in marks})
        return marks

    def servers(self) -> list[dict[str, Any]]:
        """The run's server records now, remembered for the end."""
        records = server_records(self.work_dir)
        self._servers.update({int(r["pid"]): r for r in records})
        return records

    def reap(self) -> None:
        for proc in self._runs:
            if proc.poll() is None:
                self.note(descendants(proc.pid))
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: pgid == pid
            proc.wait()
        self.servers()
        kill_servers(list(self._servers.values()))
        kill_leftovers(list(self._marks.values()))


@contextlib.contextmanager
def reaping(work_dir: Path) -> Iterator[Reaper]:
    reaper = Reaper(work_dir)
    try:
        yield reaper
    finally:
        reaper.reap()
