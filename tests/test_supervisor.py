"""The fleet heals itself: emulator servers launched by regen's own fleet code are killed,
stopped or left without their port mid-run, and the run's feed (the dispatcher, the
supervisor, the fleet report) must bring them back or finish without them, every id once.

Real processes throughout: the servers are `python -m regen.emulator` started by
`launch_fleet`, killed with real signals; the port a relaunch needs is held by a real socket.
Every wait is on a state, with a generous guard against a hang, never a tight sleep.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import pytest
import yaml
from aiohttp import web
from pydantic import SecretStr

from regen.config import RegenConfig
from regen.errors import FleetGone
from regen.fleet import (
    Fleet,
    attach_fleet,
    build_server_commands,
    generate_api_key,
    launch_fleet,
    reap_orphans,
)
from regen.fleet.cause import last_words
from regen.fleet.commands import ServerCommand
from regen.fleet.handle import Member
from regen.fleet.process import ServerProcess
from regen.fleet.report import FLEET_KEY, FleetRow
from regen.generation.feed import Feed, feeding
from regen.generation.run_plan import RunPlan
from regen.machine.ports import port_is_free
from regen.progress.fleet_live import LiveReport
from regen.rehearsal import rehearsal_config
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeSettings, ProbeTarget
from regen.storage import LocalStorage
from support.dataset import dataset_ids, manifest_keys
from support.emulator import emulators, hold_port
from tests.support.fleet import MODEL_DIR, SERVED, fleet_config, server_pids, start_owner

FAST = ProbeSettings(generation_timeout_s=5, interval_s=0.1)
GUARD_S = 120.0  # a hang guard only: no pass depends on it
# Answers of 100-200 tokens at 250 tok/s x 0.1: 40-80 ms each, so a run of a few hundred
# rows spans seconds and a fault lands inside it.
EMULATOR = {
    "load_s": 0.2, "time_scale": 0.1, "reasoning_tokens": "50:100", "answer_tokens": "50:100",
}  # fmt: skip


def _config(
    tmp_path: Path,
    servers: int,
    *,
    relaunch: dict[str, Any] | None = None,
    kind: str = "emulator",
    **engine: Any,
) -> RegenConfig:
    relaunch = {"max_restarts": 3, "backoff_s": 0.2, "hang_s": 3.0, **(relaunch or {})}
    config = fleet_config(
        tmp_path, servers, kind=kind,
        engine={"relaunch": relaunch, "emulator": EMULATOR, **engine},
    )  # fmt: skip
    generation = config.generation.model_copy(update={"fleet_dead_s": 600.0})
    return config.model_copy(update={"concurrency_per_server": 4, "generation": generation})


def _launch(config: RegenConfig) -> Fleet:
    key = generate_api_key()
    commands = build_server_commands(config, MODEL_DIR, key, config.work_dir)
    return launch_fleet(config, commands, key, probe_settings=FAST, grace_s=3)


def _prompts(count: int, prefix: str) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"{prefix}-{i:05d}" for i in range(count)],
            "messages": [[{"role": "user", "content": f"question {i}?"}] for i in range(count)],
        },
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )


def _plan(tmp_path: Path, rows: int) -> RunPlan:
    return RunPlan(
        fingerprint="f" * 64, num_rows=rows, num_shards=1, shard_size=rows, rejected=0,
        pending=[0], committed_shards=0, committed_rows=0, prompt_cache=tmp_path,
    )  # fmt: skip


class Run:
    """A run's feed over a fleet, shards submitted to it, its live reports kept."""

    def __init__(
        self, feed: Feed, fleet: Fleet, storage: LocalStorage, lives: list[LiveReport]
    ) -> None:
        self.feed, self.fleet, self.storage, self.lives = feed, fleet, storage, lives
        self.shards: list[tuple[pl.DataFrame, futures.Future[pl.DataFrame]]] = []
        self.pids_seen: set[int] = set()

    def submit(self, shards: int, rows: int) -> None:
        for k in range(shards):
            frame = _prompts(rows, f"s{k}")
            self.shards.append((frame, self.feed.dispatcher.submit_shard(k, frame)))

    def pid(self, index: int) -> int:
        process = self.fleet.launched[index].process
        assert process is not None
        self.pids_seen.add(process.pid)
        return process.pid

    def row(self, index: int) -> FleetRow:
        return self.fleet.report[index]

    def back(self, index: int, *, relaunches: int) -> bool:
        row = self.row(index)
        return row.relaunches == relaunches and row.status == "healthy"

    def stored_report(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = json.loads(self.storage.read_bytes(FLEET_KEY))
        return data

    def results(self) -> pl.DataFrame:
        return pl.concat([future.result(timeout=GUARD_S) for _, future in self.shards])

    def wait(self, what: str, done: Callable[[], bool], timeout: float = GUARD_S) -> None:
        """Until `done()`, a state; the timeout is a guard against a hang."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.fleet.report}"
            time.sleep(0.02)


@contextmanager
def _run(
    config: RegenConfig, tmp_path: Path, rows: int, fleet: Fleet | None = None
) -> Iterator[Run]:
    """The feed over a launched (or the given) fleet; on the way out, whatever happened,
    the fleet is torn down and nothing it ever started may be left running."""
    fleet = fleet or _launch(config)
    storage = LocalStorage(tmp_path / "out")
    lives: list[LiveReport] = []
    with fleet, feeding(
        config, storage, _plan(tmp_path, rows), fleet, fleet.api_key,
        progress_key="progress.json", on_live=lives.append,
    ) as feed:  # fmt: skip
        run = Run(feed, fleet, storage, lives)
        for index in range(len(fleet.launched)):
            run.pid(index)
        yield run
    if fleet.launched:
        _assert_nothing_left(run, config)
    assert not [t for t in threading.enumerate() if t.name == "regen-supervisor"]


def _assert_nothing_left(run: Run, config: RegenConfig) -> None:
    """Every server the fleet ever started (the relaunched ones too) is gone with its files."""
    for pid in run.pids_seen:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", pid
    assert server_pids([r.port for r in run.fleet.report]) == []
    assert all(port_is_free("127.0.0.1", r.port or 0) for r in run.fleet.report)
    assert not list((config.work_dir / "pids").glob("*.json"))
    assert not list((config.work_dir / "secrets").glob("*.yaml"))


def _exactly_once(out: pl.DataFrame, run: Run) -> None:
    expected = sorted(i for frame, _ in run.shards for i in frame["id"].to_list())
    assert sorted(out["id"].to_list()) == expected  # none lost, none doubled
    assert out["error"].null_count() == out.height, out.filter(pl.col("error").is_not_null())


def test_a_killed_server_is_relaunched_and_the_run_completes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, 2)
    caplog.set_level(logging.WARNING, logger="regen.fleet.supervisor")
    with _run(config, tmp_path, 300) as run:
        run.submit(2, 100)
        d = run.feed.dispatcher
        run.wait("answers from both servers", lambda: all(s.completed for s in d.stats().servers))
        old = run.pid(1)
        killed = time.time()
        os.kill(old, signal.SIGKILL)
        run.wait("server-1 back", lambda: run.back(1, relaunches=1))
        new = run.pid(1)
        assert new != old and psutil.Process(new).is_running()
        back = d.stats().servers[1]
        assert back.state == "healthy", back
        run.submit(1, 100)  # it serves again: rejoined the dispatcher
        out = run.results()
        after = d.stats().servers[1]
    _exactly_once(out, run)
    assert after.completed > back.completed, (back, after)
    row = run.row(1)
    assert row.relaunches == 1 and len(row.relaunch_causes) == 1
    assert "killed by SIGKILL (exit code -9)" in row.relaunch_causes[0], row
    stored = run.stored_report()[1]
    assert stored["relaunches"] == 1 and stored["relaunch_causes"] == list(row.relaunch_causes)
    assert stored["status"] == "healthy" and run.stored_report()[0]["relaunches"] == 0
    # The run's log has one line for it; the log's tail and the heal's times are in the report.
    log_path = config.work_dir / "logs" / "server-1.log"
    said = [r.getMessage() for r in caplog.records if "relaunching it in" in r.getMessage()]
    assert said == [
        "server-1 killed by SIGKILL (exit code -9); relaunching it in 0.2 s (1 of at most 3 in "
        f"3600 s); log: {log_path}"
    ], said
    (relaunch,) = stored["relaunch_log"]
    assert relaunch["log"] == str(log_path) and "ready to roll" in relaunch["log_tail"]
    assert killed <= relaunch["down_at"] <= relaunch["back_at"] <= time.time(), relaunch
    # The log was appended, as on resume: both starts' header lines are in it.
    text = (config.work_dir / "logs" / "server-1.log").read_text()
    assert text.count("===== regen: server-1 starting at") == 2, text[-2000:]


@pytest.mark.parametrize("servers", [2, 1])
def test_a_stopped_server_is_judged_hung_killed_and_relaunched(
    tmp_path: Path, servers: int
) -> None:
    """SIGSTOP: the process lives and holds its port but answers nothing. Beside a server that
    answers, or alone (then on its /health failing), it is judged hung after hang_s."""
    config = _config(tmp_path, servers)
    last = servers - 1
    with _run(config, tmp_path, 150 * servers) as run:
        run.submit(2, 50 * servers)
        d = run.feed.dispatcher
        run.wait("answers from it", lambda: d.stats().servers[last].completed > 5)
        old = run.pid(last)
        os.kill(old, signal.SIGSTOP)
        run.wait("it back", lambda: run.back(last, relaunches=1))
        assert not psutil.pid_exists(old) or psutil.Process(old).status() == "zombie"
        back = d.stats().servers[last]
        run.submit(1, 50 * servers)
        out = run.results()
        assert d.stats().servers[last].completed > back.completed
    _exactly_once(out, run)
    cause = run.row(last).relaunch_causes[0]
    assert "hung: no answer for " in cause and "requests in flight" in cause, cause
    # A hang fails no request: the rows it held went elsewhere at no attempt's cost.
    assert out["attempts"].max() == 1, out["attempts"].value_counts()


def test_a_busy_server_that_answers_health_is_not_judged_hung(tmp_path: Path) -> None:
    """server-1 runs 66x slower: none of its requests finishes within hang_s (each takes
    2.7-5.3 s), while server-0 answers; its /health still answers 200, so it is left alone."""
    emulator = {**EMULATOR, "server_faults": {1: ["slow=0.015"]}}
    config = _config(tmp_path, 2, relaunch={"hang_s": 2.0}, emulator=emulator)
    with _run(config, tmp_path, 100) as run:
        run.submit(2, 50)
        out = run.results()
        stats = run.feed.dispatcher.stats()
    _exactly_once(out, run)
    assert stats.servers[1].completed > 0, stats
    assert [r.relaunches for r in run.fleet.report] == [0, 0]


def test_a_server_that_cannot_come_back_stays_out_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, 2, relaunch={"max_restarts": 3, "backoff_s": 0.2})
    caplog.set_level(logging.INFO, logger="regen.fleet.supervisor")
    with _run(config, tmp_path, 200) as run:
        run.submit(2, 100)
        d = run.feed.dispatcher
        run.wait("answers from server-1", lambda: d.stats().servers[1].completed > 5)
        port = run.row(1).port or 0
        os.kill(run.pid(1), signal.SIGKILL)

        def out() -> bool:
            # Out in the report, then retired in the dispatcher (from a thread): both seen.
            return run.row(1).status == "out" and d.stats().servers[1].quarantine_reason is not None

        with hold_port(port):
            run.wait("server-1 out", out)
            results = run.results()
        stats = d.stats()
    _exactly_once(results, run)
    row = run.row(1)
    assert row.relaunches == 3 and len(row.relaunch_causes) == 3, row
    assert "relaunch failed: exited" in row.relaunch_causes[-1]
    assert [r.back_at for r in row.relaunch_log] == [None, None, None], row
    assert "Could not bind" in row.relaunch_log[-1].log_tail
    log_path = config.work_dir / "logs" / "server-1.log"
    # Each cause one line: what, the log's telling line, where the log is; a relaunch that
    # failed as the one before is not said again where the user looks (below WARNING).
    told = [r for r in caplog.records if "relaunching it in" in r.getMessage()]
    again = [r.getMessage() for r in told if r.levelno >= logging.WARNING]
    assert len(again) == 2 and all("\n" not in line for line in again), again
    same = [r.getMessage() for r in told if r.levelno < logging.WARNING]
    assert same == [
        "server-1 relaunch failed the same way; relaunching it in 0.8 s (3 of at most 3 in 3600 s)"
    ], same
    assert again[1].startswith("server-1 relaunch failed: exited with code 1: "), again
    assert "Could not bind" in again[1] and again[1].endswith(f"; log: {log_path}"), again
    said = [r.getMessage() for r in caplog.records if "stays out for the rest" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith("server-1 stays out for the rest of the run: down since ")
    assert "3 relaunches did not bring it back" in said[0] and f"(log: {log_path})" in said[0]
    assert "relaunch failed: exited with code 1" in said[0], said[0]
    assert "Could not bind" in said[0], said[0]  # the log's telling line
    assert stats.servers[1].quarantine_reason is not None and stats.servers[0].completed > 0
    assert run.stored_report()[1]["status"] == "out"


def test_a_fleet_that_cannot_come_back_is_gone_at_once(tmp_path: Path) -> None:
    config = _config(tmp_path, 2, relaunch={"max_restarts": 1, "backoff_s": 1.0})
    with _run(config, tmp_path, 600) as run:
        run.submit(3, 200)
        d = run.feed.dispatcher
        run.wait("answers", lambda: d.stats().done > 10)
        ports = [r.port or 0 for r in run.fleet.report]
        pids = [run.pid(0), run.pid(1)]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        holders = [hold_port(port) for port in ports]
        try:
            with pytest.raises(FleetGone) as gone:
                run.results()
            waited = time.monotonic() - killed
        finally:
            for holder in holders:
                holder.close()
        with pytest.raises(FleetGone):  # later shards too, at once
            d.submit_shard(9, _prompts(4, "late")).result(timeout=GUARD_S)
    message = str(gone.value)
    assert "\n" not in message, message
    assert message.startswith("fleet gone: server-"), message
    assert "down since " in message and "1 relaunch did not bring it back" in message
    assert "Could not bind" in message and "/logs/server-" in message and "out before it" in message
    # Not after generation.fleet_dead_s (600 s here): the fleet was known dead, so at once.
    assert waited < config.generation.fleet_dead_s, waited
    assert [r.status for r in run.fleet.report] == ["out", "out"]


def test_cut_answers_are_counted_per_server_in_the_fleet_report_and_the_live_card(
    tmp_path: Path,
) -> None:
    """server-1 cuts a share of its answers (finish_reason abort): each is retried and none
    stored, and the count is its own, in report/fleet.json and on the live card."""
    emulator = {**EMULATOR, "server_faults": {1: ["abort=0.3"]}}
    config = _config(tmp_path, 2, emulator=emulator)
    with _run(config, tmp_path, 200) as run:
        run.submit(2, 100)
        out = run.results()
        stats = run.feed.dispatcher.stats()
    _exactly_once(out, run)
    cut = [s.cut_answers for s in stats.servers]
    assert cut[0] == 0 and cut[1] > 0, cut
    assert [r["cut_answers"] for r in run.stored_report()] == cut
    card = run.lives[-1].card()
    assert card.endswith(f" · {cut[1]:,} cut"), card
    assert f"- server-1: {cut[1]:,} answers cut" in run.lives[-1].to_markdown()


def test_an_external_fleet_is_not_relaunched(tmp_path: Path) -> None:
    flags = [
        ["--emu-load-s", "0", "--emu-time-scale", "0.1", "--emu-reasoning-tokens", "50:100",
         "--emu-answer-tokens", "50:100", "--max-running-requests", "4", "--enable-metrics"]
        for _ in range(2)
    ]  # fmt: skip
    key = generate_api_key()
    with emulators(tmp_path, flags, served_name=SERVED, api_key=key.get_secret_value()) as emus:
        external = _config(tmp_path / "ext", 2, kind="external", urls=[e.url for e in emus])
        fleet = attach_fleet(external, key, probe_settings=FAST)
        assert fleet.launched == []
        with _run(external, tmp_path, 200, fleet=fleet) as run:
            run.submit(2, 100)
            d = run.feed.dispatcher
            run.wait("answers from server-1", lambda: d.stats().servers[1].completed > 5)
            assert not [t for t in threading.enumerate() if t.name == "regen-supervisor"]
            emus[1].stop()
            out = run.results()
            stats = d.stats()
        assert port_is_free("127.0.0.1", emus[1].port)  # nothing started in its place
    _exactly_once(out, run)
    assert stats.servers[1].state == "quarantined"
    assert [r.relaunches for r in fleet.report] == [0, 0]


def test_a_relaunch_racing_a_teardown_leaves_no_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The teardown (a Ctrl-C's, from another thread) comes while a relaunch waits out its
    backoff: the relaunch must not start a server the teardown has already passed by."""
    config = _config(tmp_path, 2, relaunch={"backoff_s": 2.0})
    caplog.set_level(logging.INFO, logger="regen.fleet.supervisor")
    fleet = _launch(config)
    with _run(config, tmp_path, 400, fleet=fleet) as run:
        run.submit(2, 200)
        d = run.feed.dispatcher
        run.wait("answers from server-1", lambda: d.stats().servers[1].completed > 0)
        os.kill(run.pid(1), signal.SIGKILL)
        run.wait("server-1 waiting to be relaunched", lambda: run.row(1).status == "relaunching")
        # Its own grace: server-0 drains the requests still coming as SGLang does on SIGTERM,
        # so the default 10 s would pass in full before SIGKILL; the race is the same.
        fleet.teardown(grace_s=1.0)
        run.wait(
            "the relaunch to stand down",
            lambda: any("not relaunched: the fleet is being torn down" in r.getMessage()
                        for r in caplog.records),
        )  # fmt: skip
        assert server_pids([r.port for r in fleet.report]) == []
    assert port_is_free("127.0.0.1", run.row(1).port or 0)


OWNER = """
import json, sys, time
from pathlib import Path
from regen.client import Dispatcher
from regen.config import parse_config
from regen.fleet import build_server_commands, generate_api_key, launch_fleet
from regen.fleet.supervisor import Supervisor
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeSettings, ProbeTarget
config = parse_config(json.loads(Path(sys.argv[1]).read_text()))
key = generate_api_key()
commands = build_server_commands(config, config.model.staged_path(), key, config.work_dir)
fleet = launch_fleet(config, commands, key, probe_settings=ProbeSettings(interval_s=0.1))
dispatcher = Dispatcher(
    fleet.endpoints, api_key=key, model=config.model.served_name, sampling=config.sampling,
    generation=config.generation, concurrency_per_server=2, reprobe=fleet.reprobe,
    supervised=True,
).start()
Supervisor(fleet, dispatcher, config.engine.relaunch, startup_timeout_s=30).start()
print(json.dumps({"ports": [c.port for c in commands]}), flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_relaunched_server_of_a_killed_run_is_reaped_by_the_next(tmp_path: Path) -> None:
    """kill -9 of regen after a relaunch: the relaunched server's PID file (rewritten by the
    relaunch) is what the next run's reaper finds it by."""
    config = _config(tmp_path, 2)
    owner, fleet = start_owner(tmp_path, config, OWNER)
    pid_file = config.work_dir / "pids" / "server-0.json"

    def recorded() -> int | None:
        try:
            return int(json.loads(pid_file.read_text())["pid"])
        except (OSError, ValueError):  # between the old one's removal and the new one's
            return None

    try:
        old = fleet["pids"][0]
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + GUARD_S
        while (new := server_pids(fleet["ports"][:1], parent=owner.pid)) in ([], [old]) or (
            recorded() != new[0]
        ):
            assert time.monotonic() < deadline and owner.poll() is None, "no relaunch"
            time.sleep(0.05)
        owner.kill()
        owner.wait(timeout=10)
        reaped = reap_orphans(config.work_dir)
        assert new[0] in reaped and fleet["pids"][1] in reaped, (reaped, new, fleet)
        assert not psutil.pid_exists(new[0]) or psutil.Process(new[0]).status() == "zombie"
        assert all(port_is_free("127.0.0.1", port) for port in fleet["ports"])
        assert not list((config.work_dir / "pids").glob("*.json"))
    finally:
        if owner.poll() is None:
            owner.kill()
        reap_orphans(config.work_dir)


def _flow_config(tmp_path: Path, prompts: int) -> RegenConfig:
    data = {
        "work_dir": str(tmp_path / "work"),
        "shard_size": 100,
        "concurrency_per_server": 4,
        "generation": {"canary_prompts": 24},
        "engine": {
            "bench": {"concurrency": 1, "max_tokens": 16, "budget_s": 0.5},
            "emulator": {
                "time_scale": 0.2, "reasoning_tokens": "20:80", "answer_tokens": "20:80",
            },
            "relaunch": {"backoff_s": 0.5, "hang_s": 10.0},
        },
    }  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    with (tmp_path / "prompts.jsonl").open("w") as fh:
        for i in range(prompts):
            message = {"role": "user", "content": f"Question {i}: name a prime above {i}."}
            fh.write(json.dumps({"id": f"q-{i:05d}", "messages": [message]}) + "\n")
    return rehearsal_config(
        config_path=tmp_path / "config.yaml",
        prompts=str(tmp_path / "prompts.jsonl"),
        out=str(tmp_path / "out"),
        servers=2,
    )


@pytest.mark.timeout(300)
def test_a_rehearsal_whose_server_is_killed_completes_with_the_relaunch_reported(
    tmp_path: Path, prefect_harness: None
) -> None:
    """The whole flow: kill -9 of one emulator once a shard has committed; the run completes,
    every id once, and report/fleet.json says the server was relaunched and why."""
    from flows.regenerate import regenerate_completions

    config = _flow_config(tmp_path, 1000)
    storage = LocalStorage(tmp_path / "out")
    killed: list[int] = []

    def kill_server_1() -> None:
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            files = list(config.work_dir.glob("runs/*/pids/server-1.json"))
            if files and manifest_keys(storage):
                pid = json.loads(files[0].read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_server_1, daemon=True)
    killer.start()
    state = regenerate_completions(config, return_state=True)
    killer.join(timeout=GUARD_S)
    assert killed, "server-1 was never killed"
    assert state.is_completed(), state
    ids = dataset_ids(storage)
    expected = [f"q-{i:05d}" for i in range(1000)]
    assert ids.lost(expected) == [] and ids.doubled() == [] and not ids.missing_data
    report = {row["server"]: row for row in json.loads(storage.read_bytes(FLEET_KEY))}
    assert report["server-1"]["relaunches"] == 1 and report["server-1"]["status"] == "healthy"
    assert "killed by SIGKILL" in report["server-1"]["relaunch_causes"][0], report
    assert report["server-0"]["relaunches"] == 0
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == "zombie"
    assert not list(config.work_dir.glob("runs/*/pids/*.json")), "PID files left"


class BusySglang:
    """A stand-in for what cannot run here: an SGLang server deep in long generations on a GPU.
    Its chat requests never finish, its /health answers the false 503 of a long prefill
    (sglang#22511), and its token counter moves while `generating` is set, as the real one's
    does at every decode step. Real HTTP on 127.0.0.1, served from a thread of its own."""

    def __init__(self) -> None:
        self.generating = True
        self.tokens = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def __enter__(self) -> BusySglang:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._up(), self._loop).result()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        self._loop.call_soon_threadsafe(self._done.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _up(self) -> None:
        self._done = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503)

    async def _chat(self, request: web.Request) -> web.Response:
        await self._done.wait()  # a generation longer than the test
        return web.Response(status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.tokens += 64 if self.generating else 0
        text = f'sglang:generation_tokens_total{{model_name="{SERVED}"}} {self.tokens}\n'
        return web.Response(text=text)


def test_a_false_503_beside_moving_tokens_is_busy_and_no_tokens_is_hung(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Alone, with requests in flight and its /health failing, a server is hung only once
    its token counter stops: while it moves, three hang_s pass and it is left alone."""
    config = _config(tmp_path, 1, relaunch={"hang_s": 1.0, "max_restarts": 0})
    caplog.set_level(logging.WARNING)
    command = ServerCommand(
        index=0, gpu=None, host="127.0.0.1", port=0,
        argv=[sys.executable, "-c", "import time; time.sleep(600)"], env={},
        log_path=tmp_path / "server-0.log", pid_path=config.work_dir / "pids" / "server-0.json",
        key_file=config.work_dir / "secrets" / "server-0.yaml", api_key=SecretStr("k"),
    )  # fmt: skip
    with BusySglang() as busy:
        endpoint = Endpoint(0, busy.url)
        row = FleetRow(server="server-0", gpu=None, port=None, url=busy.url, status="healthy")
        process = ServerProcess.start(command, "fleet")
        target = ProbeTarget(SERVED, SecretStr("k"), config.sampling)
        fleet = Fleet([Member(endpoint, row, process)], target, FAST, "fleet")
        with _run(config, tmp_path, 4, fleet=fleet) as run:
            future = run.feed.dispatcher.submit_shard(0, _prompts(4, "long"))
            d = run.feed.dispatcher
            run.wait("requests in flight", lambda: d.stats().in_flight == 4)
            moving = time.monotonic()
            run.wait("three hang_s of a busy server", lambda: time.monotonic() - moving > 3.0)
            assert run.row(0).status == "healthy" and not future.done(), run.row(0)
            busy.generating = False
            run.wait("the hang verdict", lambda: run.row(0).status == "out")
            with pytest.raises(FleetGone, match="hung: no answer for"):
                future.result(timeout=GUARD_S)
    said = [r.getMessage() for r in caplog.records if "stays out" in r.getMessage()]
    assert len(said) == 1 and "/health 503, no tokens generated" in said[0], said
    assert not psutil.pid_exists(process.pid) or psutil.Process(process.pid).status() == "zombie"


def test_a_logs_last_words_are_its_telling_line_not_its_argument_dump() -> None:
    args = "[t] server_args={'abort_on_priority_when_disabled': False, 'watchdog_timeout': 300}"
    ready = "[t] The server is fired up and ready to roll!"
    assert last_words(f"{args}\n{ready}") == ready  # nothing went wrong: its last line
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered"
    tail = f"{args}\nTraceback (most recent call last):\n  File 'x'\n{crash}\n[t] POST 200"
    assert last_words(tail) == crash
    assert last_words("") == "(nothing logged)"
    # SGLang's own stamp goes: the line that quotes it has its own time.
    stamped = "[2026-12-07 05:58:01 TP0] Could not bind 127.0.0.1:30001: address already in use"
    assert last_words(f"{stamped}\n[2026-12-07 05:58:02] Decode batch") == stamped[26:]
    assert len(last_words("x" * 1000)) == 200
