"""The dispatcher against emulators: nothing lost, nothing repeated, no idle slots.

Scheduling, retries and quarantine run against emulators served in this process (real HTTP on
127.0.0.1, up in milliseconds); a crash and a killed fleet need real emulator processes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import polars as pl
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import SecretStr

from regen.client import Dispatcher, DispatchTuning, ServerState
from regen.client.dispatcher import Reprobe, SessionFactory, keepalive_session
from regen.config import GenerationConfig, SamplingConfig
from regen.errors import FleetError, FleetUnauthorized
from regen.progress.snapshot import ProgressSnapshot
from regen.progress.writer import ProgressWriter
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import turn_request_id
from regen.storage import LocalStorage
from support.emulator import Emulator, InProcessEmulator, in_process
from support.emulator import emulators as launch_emulators

MODEL = "emu-model"
KEY = "test-key"


def flags(
    count: int,
    *,
    slots: int = 4,
    faults: dict[int, list[str]] | None = None,
    answer_tokens: str = "20:60",
    time_scale: float = 0.1,
    context_length: int = 4096,
) -> list[list[str]]:
    """The flags of `count` emulators whose tokens take time_scale/250 s each."""
    return [
        [
            "--max-running-requests", str(slots), "--context-length", str(context_length),
            "--enable-metrics", "--emu-load-s", "0", "--emu-tokens-per-s", "250",
            "--emu-time-scale", str(time_scale), "--emu-seed", str(index),
            "--emu-reasoning-tokens", "0:10", "--emu-answer-tokens", answer_tokens,
            *(arg for spec in (faults or {}).get(index, []) for arg in ("--emu-fault", spec)),
        ]
        for index in range(count)
    ]  # fmt: skip


@contextmanager
def served(count: int, **kwargs: Any) -> Iterator[list[InProcessEmulator]]:
    """Emulators served in this process (see `flags`), stopped afterwards."""
    with in_process(flags(count, **kwargs), served_name=MODEL, api_key=KEY) as fleet:
        yield fleet


@contextmanager
def emulators(tmp_path: Path, count: int, **kwargs: Any) -> Iterator[list[Emulator]]:
    """Emulator processes (see `flags`), for what only a process can do: crash, be killed."""
    with launch_emulators(
        tmp_path, flags(count, **kwargs), served_name=MODEL, api_key=KEY
    ) as fleet:
        yield fleet


def prompts(count: int, prefix: str = "p") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"{prefix}-{i:05d}" for i in range(count)],
            "messages": [[{"role": "user", "content": f"question {i}?"}] for i in range(count)],
        },
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )


def dispatcher(
    fleet: Sequence[Emulator | InProcessEmulator],
    *,
    slots: int = 4,
    key: str = KEY,
    tuning: DispatchTuning | None = None,
    reprobe: Reprobe | None = None,
    session: SessionFactory = keepalive_session,
    **generation: object,
) -> Dispatcher:
    return Dispatcher(
        [Endpoint(i, e.url) for i, e in enumerate(fleet)],
        api_key=SecretStr(key),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=256),
        generation=GenerationConfig.model_validate(generation),
        concurrency_per_server=slots,
        reprobe=reprobe,
        session=session,
        tuning=tuning or DispatchTuning(retry_backoff_s=0.02, probe_backoff_s=0.2),
    )


def assert_complete(out: pl.DataFrame, rows: pl.DataFrame, shard: int) -> None:
    assert out.schema == row_schema()
    assert out["id"].to_list() == rows["id"].to_list()
    assert out["messages"].to_list() == rows["messages"].to_list()
    assert out["shard"].unique().to_list() == [shard]


@pytest.fixture(scope="module")
def healthy() -> Iterator[list[InProcessEmulator]]:
    with served(2, context_length=2048) as fleet:
        yield fleet


def test_rows_out_match_rows_in_and_progress_is_written(
    healthy: list[InProcessEmulator], tmp_path: Path
) -> None:
    shards = [prompts(30, "a"), prompts(17, "b")]
    seen: list[ProgressSnapshot] = []
    with dispatcher(healthy) as d:
        with ProgressWriter(
            LocalStorage(tmp_path), d, total=47, interval_s=0.05, on_update=seen.append
        ):
            futures = [d.submit_shard(k, rows) for k, rows in enumerate(shards)]
            outs = [f.result(timeout=30) for f in futures]
        stats = d.stats()
    for k, (out, rows) in enumerate(zip(outs, shards, strict=True)):
        assert_complete(out, rows, k)
        assert out["error"].null_count() == out.height
        assert out["model"].unique().to_list() == [MODEL]
        assert out["completion_tokens"].min() > 0  # type: ignore[operator]
        assert out["finish_reason"].is_in(["stop", "length"]).all()
        assert set(out["server"]) <= {"server-0", "server-1"}
        assert (out["attempts"] == 1).all()
    assert stats.ok == 47 and stats.failed == 0 and stats.in_flight == 0 and stats.queued == 0
    progress = json.loads((tmp_path / "progress.json").read_bytes())
    assert (progress["done"], progress["total"], progress["fraction"]) == (47, 47, 1.0)
    assert [s["name"] for s in progress["servers"]] == ["server-0", "server-1"]
    assert seen and seen[-1].done == 47


def test_prompt_over_the_context_is_an_error_row_with_the_server_message(
    healthy: list[InProcessEmulator],
) -> None:
    rows = prompts(6)
    long = [[{"role": "user", "content": "word " * 20_000}]]
    rows = rows.with_columns(
        pl.when(pl.col("id") == "p-00003")
        .then(pl.lit(pl.Series(long, dtype=row_schema()["messages"])))
        .otherwise(pl.col("messages"))
        .alias("messages")
    )
    with dispatcher(healthy) as d:
        out = d.submit_shard(0, rows).result(timeout=30)
    assert_complete(out, rows, 0)
    bad = out.filter(pl.col("id") == "p-00003").row(0, named=True)
    assert bad["error"].startswith("HTTP 400: ") and len(bad["error"]) > len("HTTP 400: ") + 5
    assert bad["attempts"] == 1 and bad["content"] is None
    assert out.filter(pl.col("id") != "p-00003")["error"].null_count() == 5


def test_wrong_api_key_stops_the_run(healthy: list[InProcessEmulator]) -> None:
    starts: list[int] = []
    with dispatcher(healthy, key="wrong", session=counted_session(starts)) as d:
        futures = [d.submit_shard(k, prompts(10, f"s{k}")) for k in range(3)]
        for future in futures:
            with pytest.raises(FleetUnauthorized, match="API key"):
                future.result(timeout=30)
        with pytest.raises(FleetUnauthorized):
            d.submit_shard(9, prompts(2)).result(timeout=10)
    # Stopped at the first 401: only the first fill of the 8 slots was ever sent, no retry.
    assert 1 <= len(starts) <= 8, starts


def counted_session(starts: list[int]) -> SessionFactory:
    """The default transport plus a hook that appends, at each request start, how many
    requests the client has in flight (its own count, in its loop's order: no sampling)."""
    in_flight = 0

    async def start(*_: object) -> None:
        nonlocal in_flight
        in_flight += 1
        starts.append(in_flight)

    async def end(*_: object) -> None:
        nonlocal in_flight
        in_flight -= 1

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(start)
    trace.on_request_end.append(end)
    trace.on_request_exception.append(end)

    def session(limit: int, headers: dict[str, str]) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
        return aiohttp.ClientSession(connector=connector, headers=headers, trace_configs=[trace])

    return session


class Gate:
    """An emulator middleware that holds every chat request at the server until the test
    releases it by rid: what the servers hold is then state to wait on, not a sample."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.held: dict[str, asyncio.Event] = {}
        self.open = False

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/chat/completions" and not self.open:
            release = asyncio.Event()
            self.held[(await request.json())["rid"]] = release
            await release.wait()
        return await handler(request)

    def release(self, rid: str) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.held.pop(rid).set)

    def release_all(self) -> None:
        self.open = True
        for rid in list(self.held):
            self.release(rid)


def test_a_freed_slot_takes_the_next_shards_row_at_once() -> None:
    # Two shards of 10 rows on 8 slots. Once shard 0 is all sent, a slot it frees must take
    # shard 1's first row while its other 7 rows still run: a client that waited for each
    # shard would leave that slot idle (and the GPUs drained) until shard 0 was done.
    gate = Gate()
    with in_process(
        flags(2, time_scale=0.01), served_name=MODEL, api_key=KEY, middlewares=[gate.middleware]
    ) as fleet:
        gate.loop = fleet[0].loop
        with dispatcher(fleet) as d:
            shards = [prompts(10, "a"), prompts(10, "b")]
            futures = [d.submit_shard(k, rows) for k, rows in enumerate(shards)]
            _wait("8 requests held", lambda: len(gate.held) == 8)

            def rids(prefix: str, rows: range) -> list[str]:
                return [turn_request_id(f"{prefix}-{i:05d}", 1, 1) for i in rows]

            assert sorted(gate.held) == rids("a", range(8))
            gate.release(rids("a", range(1))[0])
            gate.release(rids("a", range(1, 2))[0])
            _wait(
                "shard 0's last rows held", lambda: set(rids("a", range(8, 10))) <= set(gate.held)
            )
            gate.release(rids("a", range(2, 3))[0])
            _wait("a freed slot refilled", lambda: len(gate.held) == 8)
            assert sorted(gate.held) == [*rids("a", range(3, 10)), *rids("b", range(1))]
            gate.release_all()
            for k, future in enumerate(futures):
                out = future.result(timeout=30)
                assert_complete(out, shards[k], k)
                assert out["error"].null_count() == out.height


def test_crashed_server_loses_no_row(tmp_path: Path) -> None:
    # A real process: crash-after ends it with os._exit, mid-answer.
    with emulators(tmp_path, 2, faults={1: ["crash-after=10"]}) as fleet:
        rows = prompts(80)
        with dispatcher(fleet) as d:
            out = d.submit_shard(0, rows).result(timeout=30)
            stats = d.stats()
        assert fleet[1].proc.poll() is not None, "the fault did not crash server-1"
    assert_complete(out, rows, 0)
    assert out["error"].null_count() == rows.height
    assert stats.servers[1].state is ServerState.QUARANTINED
    assert (out["server"] == "server-1").sum() <= 10
    assert stats.ok == 80


def test_hung_server_is_quarantined_and_its_rows_finish_elsewhere() -> None:
    with served(2, faults={1: ["hang-after=6"]}) as fleet:
        rows = prompts(60)
        tuning = DispatchTuning(retry_backoff_s=0.02, probe_backoff_s=0.2, probe_timeout_s=0.5)
        with dispatcher(fleet, tuning=tuning, request_timeout_s=1.0) as d:
            out = d.submit_shard(0, rows).result(timeout=30)
            stats = d.stats()
    assert_complete(out, rows, 0)
    assert out["error"].null_count() == rows.height
    assert stats.servers[1].state is ServerState.QUARANTINED
    assert stats.servers[1].quarantines == 1
    assert (out["server"] == "server-1").sum() <= 6
    # One timeout per hung slot, then the quarantine moved the rest at no attempt's cost:
    # never a timeout per row (counted, not timed, so a slow machine cannot fail it).
    hung = stats.servers[1]
    assert hung.failed_attempts <= hung.slots, stats
    assert out["attempts"].max() <= 2  # type: ignore[operator]


def test_http500_is_retried_until_it_succeeds() -> None:
    with served(2, faults={0: ["http500=0.3"], 1: ["http500=0.3"]}) as fleet:
        rows = prompts(60)
        with dispatcher(fleet, max_attempts=12) as d:
            out = d.submit_shard(0, rows).result(timeout=30)
            stats = d.stats()
    assert_complete(out, rows, 0)
    assert out["error"].null_count() == rows.height
    assert out["attempts"].max() > 1  # type: ignore[operator]
    assert stats.retries == int((out["attempts"] - 1).sum())


def test_http500_everywhere_gives_error_rows_after_max_attempts() -> None:
    with served(2, faults={0: ["http500=1.0"], 1: ["http500=1.0"]}) as fleet:
        rows = prompts(12)
        with dispatcher(fleet, max_attempts=3) as d:
            out = d.submit_shard(0, rows).result(timeout=30)
    assert_complete(out, rows, 0)
    assert (out["attempts"] == 3).all()
    assert out["error"].str.starts_with("gave up after 3 attempts: HTTP 500").all()
    # Each retry went to the other server: the last attempt is on a different one than the
    # second, so both servers appear.
    assert set(out["server"]) == {"server-0", "server-1"}


def _wait(what: str, done: Callable[[], bool], timeout: float = 10) -> None:
    """Until `done()`: a wait on state, its timeout only a guard against a hang."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def test_dead_fleet_fails_pending_shards_after_fleet_dead_s(tmp_path: Path) -> None:
    # Real processes, really killed: every connection breaks at once, as on a lost node.
    with (
        emulators(tmp_path, 2, answer_tokens="200:400") as fleet,
        dispatcher(fleet, fleet_dead_s=1.5) as d,
    ):
        first = d.submit_shard(0, prompts(4, "a")).result(timeout=30)
        pending = d.submit_shard(1, prompts(40, "b"))
        _wait("requests in flight", lambda: d.stats().in_flight > 0)
        for emu in fleet:
            os.kill(emu.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(FleetError, match=r"no healthy server for 1\.5 s"):
            pending.result(timeout=30)
        waited = time.monotonic() - killed
    assert first.height == 4 and first["error"].null_count() == 4
    # The fleet was given its fleet_dead_s before the shard failed (a lower bound cannot
    # flake on a slow machine; the 30 s above is the guard against never failing).
    assert waited >= 1.4, waited


def test_a_shared_reprobe_still_running_ends_with_the_dispatcher(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fleet's re-probe is one task its callers share (asyncio.shield), so cancelling the
    dispatcher's re-probe leaves it running on the dispatcher's loop. Closing must end it too:
    a closed loop destroys it pending, and a dead fleet's one line was followed by asyncio's
    "Task was destroyed but it is pending!" and a failed re-probe's "GeneratorExit"."""
    started = threading.Event()
    shared: dict[str, asyncio.Task[bool]] = {}

    async def probe() -> bool:
        started.set()
        await asyncio.sleep(600)
        return True

    async def reprobe(endpoint: Endpoint) -> bool:
        task = shared.get(endpoint.name)
        if task is None:
            task = shared[endpoint.name] = asyncio.get_running_loop().create_task(probe())
        return await asyncio.shield(task)

    gc.collect()  # what earlier tests left to the collector is theirs, not this test's
    caplog.clear()
    caplog.set_level(logging.ERROR, logger="asyncio")
    with served(2) as fleet:
        fleet[1].stop()
        with dispatcher(fleet, reprobe=reprobe) as d:
            future = d.submit_shard(0, prompts(20))
            assert started.wait(30), d.stats()
            assert future.result(timeout=30).height == 20
            closing = time.monotonic()
    assert time.monotonic() - closing < 5  # cancelled, not waited out
    (task,) = shared.values()
    assert task.cancelled(), task
    del task
    shared.clear()  # the last references: collected now, as a closed loop's would be
    gc.collect()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


def test_quarantined_server_leaves_for_good_and_loses_no_row() -> None:
    # The live audit's call: server-1 answers fast and passes probes, yet its answers are bad.
    probed: list[str] = []
    probed_2 = threading.Event()

    async def reprobe(endpoint: Endpoint) -> bool:
        probed.append(endpoint.name)
        if endpoint.name == "server-2":
            probed_2.set()
        return False

    with served(3, answer_tokens="40:80", time_scale=1.0) as fleet:
        rows = prompts(60)
        with dispatcher(fleet, reprobe=reprobe) as d:
            future = d.submit_shard(0, rows)
            _wait(
                "server-1 to serve and hold rows",
                lambda: bool(d.stats().servers[1].completed and d.stats().servers[1].in_flight),
            )
            d.quarantine("server-1", "empty_answer 100 % on this server")
            held_done = d.stats().servers[1].completed
            out = future.result(timeout=30)
            stats = d.stats()
            # The control: server-2 dies, is quarantined by its transport failures and
            # re-probed; by then a re-probe of server-1 would have come first (it left earlier).
            fleet[2].stop()
            tail = d.submit_shard(1, prompts(12, "z")).result(timeout=30)
            assert probed_2.wait(10), d.stats()
            with pytest.raises(ValueError, match="no server 'server-9'"):
                d.quarantine("server-9", "unknown")
            d.quarantine(0, "bad too")
            with pytest.raises(ValueError, match="server-2 is the last server"):
                d.quarantine("server-2", "the last one")
    assert_complete(out, rows, 0)
    assert out["error"].null_count() == rows.height
    assert (out["server"] == "server-1").sum() == held_done  # nothing it held came back from it
    assert out["attempts"].max() == 1  # a moved row spent no attempt
    assert stats.ok == 60 and stats.retries == 0
    held = stats.servers[1]
    assert held.state is ServerState.QUARANTINED and held.quarantines == 1
    assert held.quarantine_reason == "empty_answer 100 % on this server"
    assert stats.servers[0].quarantine_reason is None
    assert tail["error"].null_count() == tail.height
    assert "server-1" not in probed, probed  # held out: never re-probed
