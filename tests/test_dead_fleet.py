"""A fleet that cannot come back is one stop, not a storm (issue 44).

Before, a rehearsal whose emulators were all killed waited `generation.fleet_dead_s`, then
submitted and failed every remaining shard one by one (57 `Finished in state Failed` lines for
one cause), failed the flow by exception and let Prefect's temporary server print four
tracebacks as it was stopped mid-write. Now the run stops at the first shard the dead fleet
fails: the shards not started stay pending, those in flight end Cancelled, and the run ends
in one line that says the cause, what is committed and the command that resumes. A key the
servers refuse (at the start, or after a server came back with another one) stops the run the
same way, naming where the key came from and never the key.

Real processes throughout: `regen rehearse` / `regen run` subprocesses with ephemeral Prefect,
emulator servers killed with SIGKILL (their ports then held, so their relaunch fails) or
restarted with another key.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.dataset import read_manifest
from regen.generation.loop import shards_in_flight
from regen.storage import LocalStorage
from support.chaos import (
    ChaosRun,
    descendants,
    kill_servers,
    leftovers,
    local_marks,
    reaping,
    rewritten,
    server_records,
    start_rehearsal,
    surviving_servers,
    wait_until,
    write_chaos_config,
)
from support.dataset import dataset_ids, manifest_keys, read_progress
from support.emulator import MODEL_DIR, Emulator, hold_port
from support.multinode import write_prompts

pytestmark = pytest.mark.timeout(600)

ROWS, SHARD_SIZE = 400, 20
NUM_SHARDS = ROWS // SHARD_SIZE
STOP = re.compile(r"^regen: run failed: (.*)$", re.M)


def _dead_fleet_run(tmp_path: Path) -> ChaosRun:
    """400 prompts in shards of 20 on 2 emulators, each relaunched once after a second."""
    work = tmp_path / "work"
    config = write_chaos_config(tmp_path / "regen.yaml", work, shard_size=SHARD_SIZE)
    data = yaml.safe_load(config.read_text())
    data["engine"]["relaunch"] = {"max_restarts": 1, "backoff_s": 1.0}
    config.write_text(yaml.safe_dump(data))
    prompts = write_prompts(tmp_path / "prompts.jsonl", ROWS)
    return ChaosRun(config=config, out=str(tmp_path / "out"), work_dir=work, prompts=prompts)


def _shards_said(said: str, ended: str) -> set[int]:
    """The shards whose task runs ended in state `ended`, as the run's log says."""
    found = re.findall(rf"'generate-shard-(\d{{6}})' - Finished in state {ended}\(", said)
    return {int(s) for s in found}


def test_a_dead_fleet_stops_the_run_in_one_line_and_a_rerun_completes_it(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    run = _dead_fleet_run(tmp_path)
    storage = LocalStorage(Path(run.out))
    with reaping(run.work_dir) as reaper:
        proc = reaper.started(start_rehearsal(run, regen_env, tmp_path, tmp_path / "dead.log"))
        reached = wait_until(
            lambda: len(reaper.servers()) == 2 and len(manifest_keys(storage)) >= 2,
            proc,
            timeout_s=300,
        )
        said = (tmp_path / "dead.log").read_text(errors="replace")
        assert reached and proc.poll() is None, said[-4000:]
        started = reaper.note(descendants(proc.pid))
        servers = reaper.servers()
        kill_servers(servers)  # every server of the fleet, with SIGKILL
        # Their ports taken as they die: each relaunch fails for real (cannot bind), so no
        # server can come back and the fleet is gone.
        holders = [hold_port(int(r["port"])) for r in servers]
        try:
            rc = proc.wait(timeout=300)  # a hang guard
        finally:
            for holder in holders:
                holder.close()
        said = (tmp_path / "dead.log").read_text(errors="replace")
        print(said)

        assert rc == 1, said[-4000:]
        assert "Traceback" not in said and "Encountered exception" not in said, said[-6000:]
        # One line for the cause: the flow's state and the terminal's line, no shard's failure.
        stops = STOP.findall(said)
        assert len(stops) == 1, said[-4000:]
        assert len(re.findall(r"Flow run '[^']*' - Finished in state Failed\(", said)) == 1
        assert _shards_said(said, "Failed") == set(), said[-4000:]
        committed = {int(k.split("shard-")[1][:6]) for k in manifest_keys(storage)}
        rows = 0
        for shard in committed:
            manifest = read_manifest(storage, shard)
            assert manifest is not None
            rows += manifest.rows
        assert stops[0].startswith("fleet gone: server-"), stops[0]
        assert "relaunch did not bring it back" in stops[0], stops[0]
        command = f"regen rehearse --config {run.config} --out {run.out}"
        assert (
            f"; {len(committed)} of {NUM_SHARDS} shards committed ({rows:,} rows) in {run.out}, "
            f"kept; run `{command} --servers 2 --prompts {run.prompts}` again to resume"
        ) in stops[0], stops[0]
        # The shards in flight ended Cancelled with the reason; the others never started and
        # stay pending (no task run, no manifest) for the rerun.
        cancelled = _shards_said(said, "Cancelled")
        window = shards_in_flight(slots=2 * 4, shard_size=SHARD_SIZE)  # chaos config: 4 a server
        assert cancelled and len(cancelled) <= window, cancelled
        assert "not committed: the run stopped (the fleet stopped serving)" in said
        ran = _shards_said(said, r"\w+")
        assert ran == committed | cancelled, (ran, committed, cancelled)
        pending = set(range(NUM_SHARDS)) - ran
        assert len(pending) >= NUM_SHARDS - len(committed) - window, pending
        ids = dataset_ids(storage)
        assert ids.missing_data == [] and ids.doubled() == []
        assert len(ids.ids) == rows
        # What `regen status` and the progress card read: over, and why, not an ETA.
        assert read_progress(storage)["ended"] == "stopped: the fleet stopped serving"
        # Nothing left running: not a server, not Prefect's temporary server.
        assert surviving_servers(servers) == [] and server_records(run.work_dir) == []
        assert leftovers(started) == [], "a process of the stopped run is still running"

        before = local_marks(Path(run.out))
        rerun = reaper.started(start_rehearsal(run, regen_env, tmp_path, tmp_path / "rerun.log"))
        rc = rerun.wait(timeout=400)
        again = (tmp_path / "rerun.log").read_text(errors="replace")
        assert rc == 0, again[-4000:]
        ids = dataset_ids(storage)
        expected = [f"q-{i:04d}" for i in range(ROWS)]
        assert sorted(ids.ids) == expected, "an id is missing or appears twice"
        assert rewritten(before, local_marks(Path(run.out))) == [], "a committed shard was redone"


# A wrong key: external emulators (started here, with their own key) and `regen run`.


@pytest.fixture
def keys() -> tuple[str, str]:
    """The servers' key and another one; neither may appear in anything the run prints."""
    return f"right-{secrets.token_hex(8)}", f"wrong-{secrets.token_hex(8)}"


@pytest.fixture
def emulator(tmp_path: Path, keys: tuple[str, str]) -> Iterator[list[Emulator]]:
    """One external server holding the right key; the test may replace it (the list's last
    is the live one). Every one is stopped on every way out."""
    logs = tmp_path / "logs"
    logs.mkdir()
    started = [Emulator.launch(logs, api_key=keys[0], served_name="emu")]
    try:
        started[0].wait_ready()
        yield started
    finally:
        for emu in started:
            emu.stop()


def _external_config(tmp_path: Path, url: str, key: str, rows: int, shard_size: int) -> Path:
    prompts = write_prompts(tmp_path / "prompts.jsonl", rows)
    data: dict[str, Any] = {
        "model": {"source": str(MODEL_DIR), "served_name": "emu", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp_path / "out"),
        "work_dir": str(tmp_path / "work"),
        "shard_size": shard_size,
        "concurrency_per_server": 4,
        "engine": {"kind": "external", "urls": [url], "api_key": key},
        "generation": {"canary_prompts": 0},
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(config: Path, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", "--config", str(config)],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _assert_key_stop(said: str, config: Path, keys: tuple[str, str]) -> str:
    assert "Traceback" not in said and "Encountered exception" not in said, said[-6000:]
    stops = STOP.findall(said)
    assert len(stops) == 1, said[-4000:]
    assert "answered 401" in stops[0], stops[0]
    assert "the API key is wrong (the key is engine.api_key in the run's config)" in stops[0]
    assert stops[0].endswith(
        f"fix the key, then run `regen run --config {config}` again to resume"
    ), stops[0]
    assert _shards_said(said, "Failed") == set(), said[-4000:]
    assert not any(key in said for key in keys), "a key was printed"
    return str(stops[0])


def test_a_key_the_servers_refuse_stops_the_run_at_once_naming_its_source(
    tmp_path: Path, regen_env: dict[str, str], emulator: list[Emulator], keys: tuple[str, str]
) -> None:
    config = _external_config(tmp_path, emulator[0].url, keys[1], rows=40, shard_size=20)
    proc = _run(config, regen_env, tmp_path, tmp_path / "run.log")
    try:
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (tmp_path / "run.log").read_text(errors="replace")
    print(said)
    assert rc == 1, said[-4000:]
    stop = _assert_key_stop(said, config, keys)
    assert f"0 of 2 shards committed in {tmp_path / 'out'};" in stop, stop
    assert "generate-shard-" not in said, "a shard started with a key the servers refuse"


def test_a_server_back_with_another_key_stops_the_run_naming_the_keys_source(
    tmp_path: Path, regen_env: dict[str, str], emulator: list[Emulator], keys: tuple[str, str]
) -> None:
    """The server was restarted with a rotated key mid-run: its re-probe (or a request) gets
    401, which is fatal at once, not a quarantine re-probed for ever."""
    config = _external_config(tmp_path, emulator[0].url, keys[0], rows=120, shard_size=10)
    storage = LocalStorage(tmp_path / "out")
    proc = _run(config, regen_env, tmp_path, tmp_path / "run.log")
    try:
        reached = wait_until(lambda: len(manifest_keys(storage)) >= 1, proc, timeout_s=300)
        assert reached and proc.poll() is None, (tmp_path / "run.log").read_text()[-4000:]
        old = emulator[-1]
        old.stop()
        rotated = Emulator.launch(
            tmp_path / "logs", api_key=keys[1], served_name="emu", port=old.port
        )
        emulator.append(rotated)
        rotated.wait_ready()
        began = time.monotonic()
        rc = proc.wait(timeout=300)  # a hang guard: fleet_dead_s is 120 s, a 401 is at once
    finally:
        if proc.poll() is None:
            proc.kill()
    said = (tmp_path / "run.log").read_text(errors="replace")
    print(said)
    assert rc == 1, said[-4000:]
    stop = _assert_key_stop(said, config, keys)
    committed = len(manifest_keys(storage))
    assert f"; {committed} of 12 shards committed (" in stop, stop
    assert "no healthy server" not in said, "the run waited for a dead fleet, not the 401"
    assert dataset_ids(storage).doubled() == []
    print(f"stopped {time.monotonic() - began:.1f} s after the server came back")
