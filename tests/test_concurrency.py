"""The concurrency controller alone (regen.concurrency.controller, no I/O): fed a server's
figures tick by tick, it climbs while throughput rises, stops where a raise no longer pays,
backs off when the server runs out of KV or queues, stays within the server's own cap, and
keeps checking. The servers here are the emulator's own curve (regen.emulator.gpu) and a KV
pool; tests/test_tuner.py runs the thread against real emulators and a real dispatcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from regen.concurrency import Controller, Phase, Sample, TunerSettings
from regen.emulator.gpu import BatchCurve


@dataclass
class Server:
    """A server's steady state at a level: the curve's decode rate for what fits in its KV
    pool (each request holds `tokens` of it); the rest waits in its queue."""

    curve: BatchCurve
    fits: int = 10**9
    retract_over: int | None = None  # past this many in flight it retracts instead

    def sample(self, limit: int, saturated: bool = True) -> Sample:
        running = min(limit, self.fits)
        over = self.retract_over is not None and limit > self.retract_over
        return Sample(
            rate=self.curve.throughput(running),
            saturated=saturated,
            queued=float(limit - running),
            token_usage=min(1.0, running / self.fits) if self.fits < 10**9 else 0.2,
            retracted=0.2 * limit if over else 0.0,
            completed=0.5 * limit,
        )


def rate(server: Server, limit: int) -> float:
    return server.sample(limit).rate or 0.0


def run(controller: Controller, server: Server, ticks: int) -> list[int]:
    levels = []
    for _ in range(ticks):
        controller.observe(server.sample(controller.limit))
        levels.append(controller.limit)
    return levels


def best_fixed(server: Server, cap: int) -> float:
    """The best rate any fixed level up to `cap` gets (the exhaustive sweep)."""
    samples = (server.sample(n) for n in range(1, cap + 1))
    return max(s.rate or 0.0 for s in samples if not s.retracted)


@pytest.mark.parametrize("knee", [48, 128, 512])
def test_it_climbs_from_the_start_to_the_knee_and_settles(knee: int) -> None:
    server = Server(BatchCurve(250, knee))
    controller = Controller(start=64, cap=4096)
    levels = run(controller, server, 60)
    assert controller.phase is Phase.SETTLED
    assert rate(server, controller.limit) >= 0.95 * best_fixed(server, 4096)
    assert controller.limit <= 8 * knee  # no further than a raise that paid for itself
    assert levels[-1] == levels[-10]  # settled: it stays


def test_a_kv_bound_server_is_held_where_it_stops_queueing() -> None:
    """Past what its KV pool holds, a server queues the rest: no gain, and a queue."""
    server = Server(BatchCurve(250, 512), fits=100)
    controller = Controller(start=64, cap=4096)
    run(controller, server, 40)
    assert 90 <= controller.limit <= 110  # about what it runs: no more waiting in its queue
    assert rate(server, controller.limit) >= 0.95 * best_fixed(server, 4096)


def test_retraction_backs_off_and_the_level_is_not_retried_until_a_reprobe() -> None:
    server = Server(BatchCurve(250, 10_000), retract_over=150)
    settings = TunerSettings(reprobe_every=5)
    controller = Controller(start=64, cap=4096, settings=settings)
    levels = run(controller, server, 12)
    assert max(levels) > 150 and levels[-1] <= 150  # it got there, then backed off
    settled_at = levels[-1]
    after = run(controller, server, 30)
    # Re-probes go one step up now and then and come back; it never stays above 150.
    assert after[-1] <= 150 and settled_at in after


def test_it_stays_within_the_servers_cap() -> None:
    server = Server(BatchCurve(250, 10_000))
    controller = Controller(start=64, cap=80)
    assert max(run(controller, server, 30)) == 80


def test_nothing_changes_while_the_slots_are_not_all_busy() -> None:
    """The tail of a run, a shard border: the level was not exercised, nothing is learned."""
    server = Server(BatchCurve(250, 512))
    controller = Controller(start=64, cap=4096)
    for _ in range(20):
        controller.observe(server.sample(controller.limit, saturated=False))
    assert controller.limit == 64 and controller.phase is Phase.CLIMBING


def test_a_reprobe_finds_a_server_that_got_faster() -> None:
    """A run lasts days: the level is checked again, and a better one is taken."""
    server = Server(BatchCurve(250, 64))
    settings = TunerSettings(reprobe_every=4)
    controller = Controller(start=64, cap=4096, settings=settings)
    run(controller, server, 30)
    before = controller.limit
    server.curve = BatchCurve(250, 1024)  # e.g. shorter answers: far more fit at once
    run(controller, server, 60)
    assert controller.limit > 2 * before


def test_a_raise_that_costs_throughput_goes_back() -> None:
    rates = {64: 1000.0, 96: 900.0}

    def sample(limit: int) -> Sample:
        return Sample(rate=rates.get(limit, 800.0), saturated=True, queued=0.0)

    controller = Controller(start=64, cap=4096)
    for _ in range(6):
        controller.observe(sample(controller.limit))
    assert controller.limit == 64 and controller.phase is Phase.SETTLED
