"""A conversation stays on its server; the tail's stragglers are hedged (issue 40).

Against emulators served in this process: each models SGLang's prefix cache (cached tokens in
meta_info, in usage with --enable-cache-report, and on /metrics) and aborts by rid as 0.5.23
does. Counts and order are asserted, never wall-clock bounds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import polars as pl
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import SecretStr

from regen.client import Dispatcher, DispatchTuning
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import turn_request_id
from support.emulator import InProcessEmulator, in_process

MODEL = "emu-model"
KEY = "test-key"


def flags(
    count: int, *, slots: int = 4, extra: dict[int, list[str]] | None = None
) -> list[list[str]]:
    return [
        [
            "--max-running-requests", str(slots), "--context-length", "8192", "--enable-metrics",
            "--emu-load-s", "0", "--emu-tokens-per-s", "250", "--emu-time-scale", "0.02",
            "--emu-seed", str(i), "--emu-reasoning-tokens", "0:10",
            "--emu-answer-tokens", "20:60", *(extra or {}).get(i, []),
        ]
        for i in range(count)
    ]  # fmt: skip


def conversations(count: int, turns: int, prefix: str = "c") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"{prefix}-{i:04d}" for i in range(count)],
            "messages": [
                [{"role": "system", "content": f"You are assistant {i}."}]
                + [{"role": "user", "content": f"question {i}.{t}?"} for t in range(turns)]
                for i in range(count)
            ],
        },
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )


def dispatcher(
    fleet: list[InProcessEmulator],
    tuning: DispatchTuning,
    *,
    slots: int = 4,
    turns: str = "last",
    max_tokens: int = 256,
) -> Dispatcher:
    return Dispatcher(
        [Endpoint(i, e.url) for i, e in enumerate(fleet)],
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=max_tokens),
        generation=GenerationConfig(),
        concurrency_per_server=slots,
        regeneration=RegenerationConfig.model_validate({"turns": turns}),
        tuning=tuning,
    )


def _wait(what: str, done: Callable[[], bool], timeout: float = 20) -> None:
    """Until `done()`: a wait on state, its timeout only a guard against a hang."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _chat(emu: InProcessEmulator, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{emu.url}/v1/chat/completions",
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def _rid(row: str, turn: int = 1, *, hedge: bool = False) -> str:
    """The rid the dispatcher gives a row's first try of `turn`."""
    return turn_request_id(row, turn, 1, hedge=hedge)


def _server_turns(out: pl.DataFrame) -> list[list[str]]:
    return [[t["server"] for t in turns] for turns in out["turns"].to_list()]


# -- the emulator's prefix cache ------------------------------------------------------------


@pytest.mark.parametrize("report", [False, True])
def test_a_repeated_prompt_is_served_from_the_cache(report: bool) -> None:
    extra = {0: ["--enable-cache-report"] if report else []}
    with in_process(flags(1, extra=extra), served_name=MODEL, api_key=KEY) as (emu,):
        messages = [{"role": "user", "content": "what is two plus two, step by step?"}]
        body = {"messages": messages, "max_tokens": 32, "return_meta_info": True}
        first = _chat(emu, body)
        second = _chat(emu, body)
        # The next turn: the history (prompt and answer) then a new question.
        answer = second["choices"][0]["message"]["content"]
        later = _chat(
            emu,
            {**body, "messages": [*messages, {"role": "assistant", "content": answer},
                                  {"role": "user", "content": "and three plus three?"}]},
        )  # fmt: skip
        cached_metric = emu.server.counters.cached_tokens
    prompt = first["usage"]["prompt_tokens"]
    meta = [a["choices"][0]["meta_info"] for a in (first, second, later)]
    assert [m["cached_tokens"] for m in meta[:2]] == [0, prompt - 1]  # the last is computed
    assert meta[1]["cached_tokens_details"] == {"device": prompt - 1, "host": 0}
    assert "cached_tokens_details" not in meta[0]
    # The new turn's prompt starts with the first prompt: at least that much is held.
    assert prompt - 1 <= meta[2]["cached_tokens"] < later["usage"]["prompt_tokens"]
    details = [a["usage"]["prompt_tokens_details"] for a in (first, second, later)]
    if report:
        assert details == [{"cached_tokens": m["cached_tokens"]} for m in meta]
    else:
        assert details == [None, None, None]
    assert cached_metric == meta[1]["cached_tokens"] + meta[2]["cached_tokens"]


def test_without_the_radix_cache_nothing_is_cached() -> None:
    extra = {0: ["--disable-radix-cache"]}
    with in_process(flags(1, extra=extra), served_name=MODEL, api_key=KEY) as (emu,):
        body = {"messages": [{"role": "user", "content": "hi"}], "return_meta_info": True}
        answers = [_chat(emu, body) for _ in range(2)]
    assert [a["choices"][0]["meta_info"]["cached_tokens"] for a in answers] == [0, 0]


def test_abort_matches_rids_by_prefix_as_sglang_does() -> None:
    # 0.5.23: an abort goes through only for a rid in flight, then cuts every request whose
    # rid starts with it (scheduler.abort_request).
    slow = {0: ["--emu-answer-tokens", "4000:4000", "--emu-time-scale", "1"]}
    with in_process(flags(1, extra=slow), served_name=MODEL, api_key=KEY) as (emu,):
        scheduler = emu.server.scheduler

        async def scenario() -> list[str]:
            async def one(rid: str) -> str:
                loop = asyncio.get_running_loop()
                body = {"messages": [{"role": "user", "content": rid}], "rid": rid,
                        "max_tokens": 4000}  # fmt: skip
                answer = await loop.run_in_executor(None, _chat, emu, body)
                return str(answer["choices"][0]["finish_reason"])

            tasks = [asyncio.ensure_future(one(r)) for r in ("x1", "x10", "y")]
            while scheduler.batch.running < 3:
                await asyncio.sleep(0.005)
            assert scheduler.abort("x") == 0  # not a rid in flight: nothing
            assert scheduler.abort("x1") == 2  # x1 and x10
            scheduler.abort("y")
            return list(await asyncio.gather(*tasks))

        # The emulator's own loop runs the scheduler; the test drives it from there.
        reasons = asyncio.run_coroutine_threadsafe(scenario(), emu.loop).result(timeout=30)
    assert reasons == ["abort", "abort", "abort"]


# -- affinity -------------------------------------------------------------------------------


@pytest.mark.parametrize("affinity", [True, False])
def test_a_conversation_stays_on_the_server_that_answered_its_last_turn(affinity: bool) -> None:
    # One conversation of 5 turns on 3 idle servers: least-loaded with round-robin ties (the
    # old rule) sends its turns round the fleet; affinity keeps all on the first.
    with in_process(flags(3), served_name=MODEL, api_key=KEY) as fleet:
        rows = conversations(1, 5)
        tuning = DispatchTuning(affinity=affinity)
        with dispatcher(fleet, tuning, turns="all") as d:
            out = d.submit_shard(0, rows).result(timeout=60)
            stats = d.stats()
        cached = [emu.server.counters.cached_tokens for emu in fleet]
    (servers,) = _server_turns(out)
    assert out["error"].null_count() == 1
    if affinity:
        assert servers == ["server-0"] * 5
        assert (stats.home_turns, stats.moved_turns) == (4, 0)
        # Every later turn found its history in server-0's cache.
        assert cached[0] > 0 and cached[1:] == [0, 0]
    else:
        hops = sum(a != b for a, b in itertools.pairwise(servers))
        assert hops >= 3, servers  # most turns land where the history is not cached
        assert stats.home_turns == 0


class Gate:
    """An emulator middleware that holds the chat requests of the rids it is given until the
    test releases them: what each server holds is then state, not timing."""

    def __init__(self, rids: set[str]) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.rids = rids
        self.held: dict[str, asyncio.Event] = {}
        self.seen: list[tuple[str, int]] = []  # (rid, port) in arrival order

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/chat/completions":
            rid = (await request.json())["rid"]
            self.seen.append((rid, request.transport.get_extra_info("sockname")[1]))  # type: ignore[union-attr]
            if rid in self.rids:
                release = asyncio.Event()
                self.held[rid] = release
                await release.wait()
        return await handler(request)

    def release(self, rid: str) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.held[rid].set)


def test_a_turn_leaves_a_home_busier_than_the_bound() -> None:
    # Rows c (2 turns), x, b on 2 servers: c and b on server-0, x on server-1, all held.
    # x ends, then c's first turn: server-0 still runs b, server-1 nothing; with a slack of
    # 0 (home may be no busier than the least loaded) c's next turn goes to server-1.
    gate = Gate({_rid("c"), _rid("x"), _rid("b")})
    with in_process(
        flags(2), served_name=MODEL, api_key=KEY, middlewares=[gate.middleware]
    ) as fleet:
        gate.loop = fleet[0].loop
        tuning = DispatchTuning(affinity=True, affinity_slack=0.0, hedge=False)
        rows = pl.DataFrame(
            {
                "id": ["c", "x", "b"],
                "messages": [
                    [{"role": "user", "content": "one?"}, {"role": "user", "content": "two?"}],
                    [{"role": "user", "content": "x?"}],
                    [{"role": "user", "content": "b?"}],
                ],
            },
            schema={"id": pl.String, "messages": row_schema()["messages"]},
        )
        with dispatcher(fleet, tuning, turns="all") as d:
            future = d.submit_shard(0, rows)
            _wait("3 requests held", lambda: len(gate.held) == 3)
            ports = dict(gate.seen)
            assert ports == {
                _rid("c"): fleet[0].port, _rid("x"): fleet[1].port, _rid("b"): fleet[0].port
            }  # fmt: skip
            gate.release(_rid("x"))
            _wait("x answered", lambda: d.stats().servers[1].in_flight == 0)
            gate.release(_rid("c"))
            _wait("c's next turn sent", lambda: _rid("c", 2) in dict(gate.seen))
            gate.release(_rid("b"))
            out = future.result(timeout=60)
            stats = d.stats()
    assert dict(gate.seen)[_rid("c", 2)] == fleet[1].port
    servers = dict(zip(out["id"].to_list(), _server_turns(out), strict=True))
    assert servers["c"] == ["server-0", "server-1"]
    assert (stats.home_turns, stats.moved_turns) == (0, 1)


# -- hedging the tail -----------------------------------------------------------------------


class Watch:
    """An emulator middleware that logs, in order, each chat answer (port, rid, finish_reason)
    and each abort (port, rid) the servers received."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str, str]] = []

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        port = request.transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        if request.path == "/abort_request":
            self.events.append(("abort", port, (await request.json())["rid"], ""))
        response = await handler(request)
        if request.path == "/v1/chat/completions" and isinstance(response, web.Response):
            body = json.loads(response.body)  # type: ignore[arg-type]
            reason = body["choices"][0]["finish_reason"]
            self.events.append(("answer", port, body["id"], reason))
        return response

    def answers(self, port: int) -> dict[str, str]:
        return {rid: why for kind, p, rid, why in self.events if kind == "answer" and p == port}


def test_a_straggler_on_a_slow_server_is_hedged_and_stored_once() -> None:
    # server-0 decodes 50 times slower. Once the queue is empty, the fast server's free slots
    # take copies of server-0's requests; each row keeps its first answer, and the other copy
    # is aborted by rid on its server, which ends it (finish_reason abort) and frees the slot.
    watch = Watch()
    extra = {0: ["--emu-fault", "slow=0.02"]}
    with in_process(
        flags(2, slots=2, extra=extra), served_name=MODEL, api_key=KEY,
        middlewares=[watch.middleware],
    ) as fleet:  # fmt: skip
        tuning = DispatchTuning(hedge=True, hedge_after=0.0, hedge_min_samples=1)
        rows = conversations(24, 1, "h")
        slow, fast = fleet
        with dispatcher(fleet, tuning, slots=2) as d:
            out = d.submit_shard(0, rows).result(timeout=120)
            _wait("every copy ended", lambda: d.stats().servers[0].in_flight == 0)
            stats = d.stats()
        _wait("the slow server's slots free", lambda: slow.server.scheduler.batch.running == 0)
    assert out["id"].to_list() == rows["id"].to_list()  # each row once, in order
    assert out["error"].null_count() == rows.height
    assert stats.hedged >= 1 and stats.hedge_wins >= 1
    assert stats.ok == rows.height and stats.in_flight == 0
    # Every copy went to the fast server under its own rid.
    copy_of = {_rid(i, hedge=True): i for i in rows["id"]}
    copies = [rid for rid in watch.answers(fast.port) if rid in copy_of]
    assert len(copies) == stats.hedged
    # Each hedged row kept one answer: the copy's (server-1) or the straggler's (server-0),
    # and the other one's server was asked to abort it by its rid.
    kept = dict(zip(out["id"].to_list(), out["server"].to_list(), strict=True))
    hedged = {copy_of[rid] for rid in copies}
    won = {rid for rid in hedged if kept[rid] == "server-1"}
    assert len(won) == stats.hedge_wins

    def aborts(port: int) -> list[str]:
        return [rid for kind, p, rid, _ in watch.events if kind == "abort" and p == port]

    assert sorted(aborts(slow.port)) == sorted(_rid(i) for i in won)
    assert sorted(aborts(fast.port)) == sorted(_rid(i, hedge=True) for i in hedged - won)
    # A straggler still running when its abort came ended as an abort, freeing its slot.
    for rid in aborts(slow.port):
        at = watch.events.index(("abort", slow.port, rid, ""))
        answered_before = any(
            e[0] == "answer" and e[1] == slow.port and e[2] == rid for e in watch.events[:at]
        )
        assert answered_before or watch.answers(slow.port)[rid] == "abort", rid


def test_an_even_fleet_hedges_nothing() -> None:
    # Requests of ~100 ms, so the client's own overhead does not make a server look slow.
    extra = {i: ["--emu-time-scale", "0.5"] for i in range(2)}
    with in_process(flags(2, slots=2, extra=extra), served_name=MODEL, api_key=KEY) as fleet:
        tuning = DispatchTuning(hedge=True, hedge_after=0.0, hedge_min_samples=4)
        rows = conversations(32, 1, "e")
        with dispatcher(fleet, tuning, slots=2) as d:
            out = d.submit_shard(0, rows).result(timeout=60)
            stats = d.stats()
    assert out.height == rows.height and stats.hedged == 0
