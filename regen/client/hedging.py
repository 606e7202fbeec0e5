"""Hedging the tail: which straggler a free slot copies, from each server's measured speed.

Once nothing is queued, a free slot takes a second copy (its own rid) of a straggler: a
request that has run `hedge_after` times its server's mean request time, on a server measured
at most `hedge_slow_ratio` as fast as the free one (per-request tokens/s of its answers). The
first answer settles the turn, exactly once; the other copy is aborted by rid on its server
(POST /abort_request; SGLang cuts every rid the given one prefixes, and regen's rids are
prefix-free, so an abort cuts that copy alone) and its slot counts as busy until the abort's
answer comes back. A copy that fails while the other runs is dropped, not retried.

Pure functions of the servers' state (regen.client.state); the scheduler launches the copy.
"""

from __future__ import annotations

from regen.client.state import Server, Work
from regen.client.tuning import DispatchTuning


def observe(server: Server, tokens: int, latency: float, tuning: DispatchTuning) -> None:
    """A server's measured per-request speed and request time: moving averages of its
    answers' tokens and seconds (a plain mean over the first 1/alpha), the speed their ratio,
    so a request's fixed overhead weighs as little as it costs."""
    if tokens <= 0 or latency <= 0:
        return
    server.samples += 1
    alpha = max(tuning.speed_ewma_alpha, 1 / server.samples)
    server.tokens += alpha * (tokens - server.tokens)
    server.took += alpha * (latency - server.took)
    server.speed = server.tokens / server.took


def straggler(
    servers: list[Server], target: Server, tuning: DispatchTuning, now: float
) -> tuple[Work | None, float]:
    """The row a free slot of `target` should copy (the longest-running straggler on a server
    slow enough), or None; and when the next request becomes one (inf when none will)."""
    t = tuning
    wake = float("inf")
    best: tuple[float, Work] | None = None
    for source in servers:
        if (
            source is target
            or source.samples < t.hedge_min_samples
            or source.speed > t.hedge_slow_ratio * target.speed
        ):
            continue
        due = t.hedge_after * source.took
        for flight in source.running:
            work = flight.work
            if work.copies != 1 or work.settled or not work.job.is_open():
                continue
            ran = now - flight.since
            if ran < due:
                wake = min(wake, flight.since + due)
            elif best is None or ran > best[0]:
                best = (ran, work)
    return (None if best is None else best[1]), wake
