"""The dispatcher's decisions, driven by hand: no server, no HTTP, no event loop.

The scheduler (regen.client.scheduler, with regen.client.health and regen.client.hedging)
decides over the fleet's state and leaves what it decided in its outboxes; these tests read
the outboxes and feed it replies as a server would answer. The same behaviour over real
servers: tests/test_dispatcher.py, tests/test_affinity_hedge.py, tests/test_supervisor.py.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from regen.client.scheduler import Scheduler
from regen.client.send import Reply
from regen.client.shard_job import ShardJob
from regen.client.state import Flight
from regen.client.stats import ServerState
from regen.client.timeouts import RequestTimeout
from regen.client.tuning import DispatchTuning
from regen.errors import FleetGone
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scheduler(
    servers: int = 2,
    slots: int = 2,
    *,
    clock: Clock | None = None,
    supervised: bool = False,
    max_attempts: int = 3,
    **tuning: object,
) -> Scheduler:
    t = DispatchTuning.model_validate(tuning)
    return Scheduler(
        [Endpoint(i, f"http://127.0.0.1:{9000 + i}") for i in range(servers)],
        slots,
        tuning=t,
        max_attempts=max_attempts,
        timeout=RequestTimeout(256, t, None),
        supervised=supervised,
        clock=clock or Clock(),
    )


def job(rows: int, *, shard: int = 0, turns: int = 1) -> ShardJob:
    frame = pl.DataFrame(
        {
            "id": [f"r-{shard}-{i}" for i in range(rows)],
            "messages": [
                [{"role": "user", "content": f"q{i}.{t}"} for t in range(turns)]
                for i in range(rows)
            ],
        },
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )
    return ShardJob(shard, frame, turns="all" if turns > 1 else "last")


def ok(tokens: int = 10, latency: float = 1.0) -> Reply:
    body = {
        "choices": [{"message": {"content": "an answer"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": tokens},
    }
    return Reply(0.0, latency, status=200, raw=json.dumps(body).encode())


def cut() -> Reply:
    """What an aborted copy gets back: a 200 the server cut short."""
    body = {"choices": [{"message": {"content": ""}, "finish_reason": {"type": "abort"}}]}
    return Reply(0.0, 0.1, status=200, raw=json.dumps(body).encode())


BROKEN = Reply(0.0, 0.1, failure="ServerDisconnectedError")


def launched(s: Scheduler) -> list[Flight]:
    flights = list(s.launched)
    s.launched.clear()
    return flights


def on(flights: list[Flight]) -> list[int]:
    return [f.server.endpoint.index for f in flights]


def test_rows_go_to_the_least_loaded_server_ties_round_robin_and_fill_only_free_slots() -> None:
    s = scheduler(servers=3, slots=2)
    s.accept(job(10))
    flights = launched(s)
    assert on(flights) == [0, 1, 2, 0, 1, 2]
    stats = s.counters.snapshot(s.servers, 1.0)
    assert (stats.submitted, stats.in_flight, stats.queued, stats.sent) == (10, 6, 4, 6)
    # An answer frees a slot on server 1: the next row goes there, the only free one.
    s.landed(flights[1], ok())
    assert on(launched(s)) == [1]
    assert s.counters.ok == 1


def test_a_quarantined_server_gets_nothing_and_a_held_one_comes_back_on_restore() -> None:
    s = scheduler(servers=2, slots=2)
    s.health.hold(s.servers[0], "relaunching")
    s.accept(job(6))
    assert on(launched(s)) == [1, 1]
    assert s.servers[0].state is ServerState.RELAUNCHING
    assert not s.down, "a server being relaunched is not a dead fleet"
    s.health.restore(s.servers[0])
    assert on(launched(s)) == [0, 0]


def test_a_transport_failure_is_retried_elsewhere_after_a_backoff_then_fails_the_row() -> None:
    s = scheduler(servers=2, slots=1, max_attempts=2, quarantine_after=99)
    s.accept(job(1))
    (first,) = launched(s)
    s.landed(first, BROKEN)
    ((delay, work),) = s.retries
    assert delay == DispatchTuning().retry_backoff_s and work.avoid == first.server.endpoint.index
    s.retries.clear()
    s.requeue(work)
    (second,) = launched(s)
    assert second.server is not first.server, "a retry goes to another server while one is up"
    assert work.attempts == 2
    s.landed(second, BROKEN)
    assert not s.retries and s.counters.failed == 1
    result = work.job.future.result(timeout=0)
    assert result["error"][0].startswith("gave up after 2 attempts: ServerDisconnectedError")


def test_quarantine_moves_the_servers_rows_at_no_attempts_cost_and_reprobes_it() -> None:
    s = scheduler(servers=2, slots=2, quarantine_after=2)
    s.accept(job(4))
    flights = launched(s)
    bad = [f for f in flights if f.server.endpoint.index == 0]
    s.landed(bad[0], BROKEN)
    s.retries.clear()
    s.landed(bad[1], BROKEN)  # the second in a row: out
    assert s.servers[0].state is ServerState.QUARANTINED
    assert s.probing == {s.servers[0]: True}
    assert not s.down, "server 1 still serves"
    # Both rows failed there, each an attempt; they wait for their backoff (no other row
    # was left on the server for the quarantine to move).
    assert [w.attempts for _, w in s.retries] == [1]
    s.health.readmit(s.servers[0], "passed its probe")
    assert s.servers[0].healthy and s.servers[0].consecutive_failures == 0


def test_rows_taken_back_by_a_quarantine_keep_their_attempts() -> None:
    s = scheduler(servers=2, slots=2)
    s.accept(job(3))
    flights = launched(s)
    s.health.quarantine(s.servers[0], "bad answers", reprobe=False)
    taken = s.taken
    assert {f.server.endpoint.index for f in taken} == {0} and len(taken) == 2
    moved = launched(s)
    assert on(moved) == [1], "one free slot on server 1 takes a moved row"
    assert all(f.work.attempts == 1 for f in moved)
    assert len(s.retry) == 1 and flights[0].work in {moved[0].work, s.retry[0]}


def test_no_healthy_server_starts_the_fleet_dead_clock_unless_supervised() -> None:
    for supervised in (False, True):
        s = scheduler(servers=1, slots=1, quarantine_after=1, supervised=supervised)
        s.accept(job(1))
        (flight,) = launched(s)
        s.landed(flight, BROKEN)
        assert s.servers[0].state is ServerState.QUARANTINED
        assert s.down is not supervised
        s.health.readmit(s.servers[0], "back")
        assert not s.down


def test_the_last_server_cannot_be_quarantined_but_retiring_it_ends_the_fleet() -> None:
    s = scheduler(servers=2, slots=1, supervised=True)
    pending = job(5)
    s.accept(pending)
    launched(s)
    s.health.hold_out(s.servers[0], "bad GPU")
    with pytest.raises(ValueError, match="server-1 is the last server that can serve"):
        s.health.hold_out(s.servers[1], "also bad")
    assert s.fatal is None
    s.health.hold_out(s.servers[1], "relaunch failed 3 times", retired=True)
    assert isinstance(s.fatal, FleetGone)
    assert str(s.fatal) == "fleet gone: server-1 relaunch failed 3 times; out before it: server-0"
    assert s.probing == dict.fromkeys(s.servers, False)
    with pytest.raises(FleetGone):
        pending.future.result(timeout=0)
    assert s.counters.snapshot(s.servers, 1.0).in_flight == 0


def test_a_next_turn_stays_home_unless_its_server_is_much_busier() -> None:
    s = scheduler(servers=2, slots=4, affinity_slack=0.25)  # one slot of slack
    s.health.hold(s.servers[1], "relaunching")
    s.accept(job(4, turns=2))
    flights = launched(s)
    assert on(flights) == [0, 0, 0, 0]
    s.health.restore(s.servers[1])  # back, and idle: nothing is queued
    # Server 0 answers with 3 still running against server 1's 0: too busy, the turn moves.
    s.landed(flights[0], ok())
    (moved,) = launched(s)
    assert moved.server.endpoint.index == 1 and moved.work.home == 0
    # Next: 2 running against 1, within the slack: the turn stays where its cache is.
    s.landed(flights[1], ok())
    (home,) = launched(s)
    assert home.server.endpoint.index == 0 and home.rid != flights[1].rid
    assert (s.counters.moved_turns, s.counters.home_turns) == (1, 1)
    assert s.counters.ok == 0, "rows, not turns: none has answered its last turn yet"


def test_a_straggler_is_hedged_on_a_faster_free_server_and_settled_once() -> None:
    clock = Clock()
    s = scheduler(
        servers=2, slots=1, clock=clock, hedge=True, hedge_min_samples=1, hedge_after=1.0
    )
    s.accept(job(2))
    slow_flight, fast_flight = launched(s)
    # Server 1 answers fast; server 0's request runs on.
    s.servers[0].samples, s.servers[0].speed, s.servers[0].took = 1, 10.0, 2.0
    clock.now += 0.1
    s.landed(fast_flight, ok(tokens=100, latency=0.1))
    assert launched(s) == [], "not a straggler yet: the hedge timer is set for when it is"
    assert s.rearm and s.wake_in == pytest.approx(2.0 - 0.1)
    clock.now += 10.0
    s.pump()
    (copy,) = launched(s)
    assert copy.server.endpoint.index == 1 and copy.work is slow_flight.work
    assert copy.rid != slow_flight.rid and copy.work.attempts == 1, "a copy spends no attempt"
    stats = s.counters.snapshot(s.servers, 1.0)
    assert (stats.hedged, stats.in_flight) == (1, 1), "one row, two requests"
    s.landed(copy, ok())
    assert s.cut == [slow_flight], "the straggler is aborted on its server"
    assert s.counters.hedge_wins == 1 and s.counters.ok == 2
    assert s.counters.snapshot(s.servers, 1.0).in_flight == 0
    assert s.counters.spare == 1, "its slot stays busy until the abort's answer"
    s.landed(slow_flight, cut())
    assert s.counters.spare == 0 and s.counters.ok == 2 and not s.retries


def test_spare_copies_are_zero_once_everything_is_aborted() -> None:
    clock = Clock()
    s = scheduler(servers=2, slots=1, clock=clock, hedge=True, hedge_min_samples=1)
    s.accept(job(2))
    _, fast_flight = launched(s)
    s.servers[0].samples, s.servers[0].speed, s.servers[0].took = 1, 10.0, 2.0
    clock.now += 100.0
    s.landed(fast_flight, ok(tokens=100, latency=0.1))
    assert len(launched(s)) == 1 and s.counters.spare == 1
    s.abort_all(RuntimeError("stopped"))
    assert s.counters.spare == 0
    assert len(s.taken) == 2, "both copies of the row are cancelled"
    assert s.counters.snapshot(s.servers, 1.0).in_flight == 0
