"""A `regen run` on real SGLang servers, handed to a test while it generates: the run's process
and its servers' PIDs, for a test that kills the run (`resumed`) or one of its servers.

Whatever the test does, nothing outlives it: leaving the block before the run ended kills the
run's group and stops every process it owned (tests/support/cli.py's `regen_process`), and the
lane's reaper (support/reaper.py) stops whatever else carries the test's scope, servers a
killed run left behind or relaunched included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from regen.dataset import manifested_shards
from regen.dataset.keys import FLEET_KEY
from regen.storage import LocalStorage
from support.dataset import read_progress
from support.engine import HANG_GUARD_S
from tests.support.cli import regen_process


@dataclass
class LiveRun:
    """A running `regen run`: its process, config and log."""

    proc: subprocess.Popen[str]
    config: dict[str, Any]
    log: Path

    @property
    def storage(self) -> LocalStorage:
        return LocalStorage(Path(self.config["output"]))

    def servers(self) -> dict[int, dict[str, Any]]:
        """This run's servers by port: their PID files (`pid` is the launcher, `pgid` its
        group, which holds SGLang's scheduler and detokenizer)."""
        found = {}
        for path in Path(self.config["work_dir"]).glob("runs/*/pids/server-*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):  # being written
                continue
            if record.get("owner_pid") == self.proc.pid:
                found[int(record["port"])] = record
        return found

    def server_pids(self) -> list[int]:
        """The launchers' PIDs, in port order."""
        return [r["pid"] for _, r in sorted(self.servers().items())]

    def kill_server(self, port: int, sig: signal.Signals = signal.SIGKILL) -> int:
        """Signal the whole group of the server on `port` (a crash: its scheduler and
        detokenizer die with it); the launcher's PID it had."""
        record = self.servers()[port]
        os.killpg(int(record["pgid"]), sig)
        return int(record["pid"])

    def fleet(self) -> dict[str, dict[str, Any]]:
        """report/fleet.json by server name (`server-1`); empty before it is written."""
        try:
            rows = json.loads(self.storage.read_bytes(FLEET_KEY))
        except FileNotFoundError:
            return {}
        return {row["server"]: row for row in rows}

    def server_tokens(self, name: str) -> int:
        """The output tokens the run's dispatcher has taken from server `name` so far, per
        progress.json (rewritten every generation.progress_interval_s)."""
        servers = {s["name"]: s for s in read_progress(self.storage)["servers"]}
        return int(servers[name]["output_tokens"])

    def until(self, what: str, done: Callable[[], bool]) -> None:
        """Wait for a state of the run while it runs; HANG_GUARD_S is a hang guard."""
        deadline = time.monotonic() + HANG_GUARD_S
        while not done():
            ended = self.proc.poll() is not None
            assert not ended, f"the run ended before {what}:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"no {what} in {HANG_GUARD_S} s"
            time.sleep(0.2)

    def ids(self) -> list[str]:
        """The input's ids, in file order."""
        lines = Path(self.config["prompts"]).read_text().splitlines()
        return [json.loads(line)["id"] for line in lines]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = HANG_GUARD_S) -> int:
        """Until the run ends; its exit code."""
        return self.proc.wait(timeout=timeout)


@contextmanager
def running(tmp: Path, config: dict[str, Any], env: dict[str, str]) -> Iterator[LiveRun]:
    """`regen run` over `config`, yielded once a shard has committed (its fleet is up and
    generating) and every server of it has recorded its PID file."""
    path = tmp / "node.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp / "run.log"
    servers = int(config["engine"]["servers"])
    with (
        log.open("w") as out,
        regen_process(
            ["run", "--config", str(path)], env, tmp, stdout=out, stderr=subprocess.STDOUT
        ) as proc,
    ):
        run = LiveRun(proc, config, log)
        deadline = time.monotonic() + HANG_GUARD_S
        while not (manifested_shards(run.storage) and len(run.servers()) == servers):
            assert proc.poll() is None, f"the run ended first:\n{run.output()[-4000:]}"
            assert time.monotonic() < deadline, f"no shard in {HANG_GUARD_S} s:\n{run.output()}"
            time.sleep(0.1)
        yield run
