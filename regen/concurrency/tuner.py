"""The thread that tunes every server's concurrency while the run generates.

Every `interval_s` it reads each server's `/metrics` (its decode counter, queue, KV usage and
retractions) and the dispatcher's counters (whether the server's slots were all busy with rows
waiting, and the tokens it delivered, the rate where a server has no decode counter), hands
each server's controller one `Sample`, and applies what changed through the dispatcher's one
lever, `set_slots`. A server whose `/metrics` does not answer is measured from the client's
side alone; a restarted server (its counters reset) is measured again from its next tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from regen.client import Dispatcher
from regen.client.stats import DispatchStats, ServerState, ServerStats
from regen.concurrency.controller import Controller, Decision, Sample, TunerSettings
from regen.fleet.metrics import ServerMetrics, scrape
from regen.machine.ticker import Ticker
from regen.sglang_api.endpoint import Endpoint

log = logging.getLogger(__name__)

Scrape = Callable[[str], ServerMetrics | None]
FULL = 0.95
"""A server's slots count as all busy at this share: one may be between two rows."""


@dataclass
class _Seen:
    """A server's counters at the previous tick."""

    at: float
    decode: float | None
    retracted: float | None
    output: int
    completed: int
    saturated: bool


class ConcurrencyTuner:
    """One controller per server, fed every `settings.interval_s` from a daemon thread."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        endpoints: list[Endpoint],
        caps: dict[str, int],
        *,
        start: int,
        settings: TunerSettings | None = None,
        scrape_metrics: Scrape = scrape,
    ) -> None:
        self.settings = settings or TunerSettings()
        self._dispatcher = dispatcher
        self._endpoints = endpoints
        self._scrape = scrape_metrics
        self.controllers = {
            e.name: Controller(
                start, caps.get(e.name, self.settings.max_concurrency), self.settings
            )
            for e in endpoints
        }
        self.last: dict[str, Decision] = {}
        self.changes: list[tuple[str, Decision]] = []  # every change, in order, by server
        self._seen: dict[str, _Seen] = {}
        self._ticker = Ticker("regen-tuner", self.settings.interval_s, self.tick)

    def levels(self) -> dict[str, int]:
        """Each server's concurrency now."""
        return {name: c.limit for name, c in self.controllers.items()}

    def tick(self) -> dict[str, Decision]:
        """Measure every server once and apply what its controller decides."""
        stats = self._dispatcher.stats()
        by_name = {s.name: s for s in stats.servers}
        for endpoint in self._endpoints:
            server = by_name.get(endpoint.name)
            if server is None:
                continue
            sample = self._sample(endpoint, server, stats)
            if sample is None:
                continue
            controller = self.controllers[endpoint.name]
            decision = controller.observe(sample)
            self.last[endpoint.name] = decision
            if decision.changed:
                self._dispatcher.set_slots(endpoint.name, decision.limit)
                self.changes.append((endpoint.name, decision))
                log.info(
                    "concurrency: %s %d -> %d (%s)",
                    endpoint.name, decision.previous, decision.limit, decision.reason,
                )  # fmt: skip
        return dict(self.last)

    def _sample(
        self, endpoint: Endpoint, server: ServerStats, stats: DispatchStats
    ) -> Sample | None:
        """The interval since the previous tick; None for the first (nothing to compare)."""
        now = time.monotonic()
        metrics = self._scrape(endpoint.url)
        # At its level: every slot busy, rows waiting, and no more in flight than the level
        # (after a cut the excess drains as its requests end; the server still holds it).
        busy = (
            server.state is ServerState.HEALTHY
            and FULL * server.slots <= server.in_flight <= server.slots
            and stats.queued > 0
        )
        seen = _Seen(
            now,
            metrics.decode_tokens if metrics else None,
            metrics.retracted if metrics else None,
            server.output_tokens,
            server.completed,
            busy,
        )
        before = self._seen.get(endpoint.name)
        self._seen[endpoint.name] = seen
        if before is None or now <= before.at:
            return None
        span = now - before.at
        rate: float | None = (seen.output - before.output) / span
        retracted = 0.0
        if seen.decode is not None and before.decode is not None:
            # A counter that went down belongs to a restarted server: nothing to compare.
            rate = (seen.decode - before.decode) / span if seen.decode >= before.decode else None
        if seen.retracted is not None and before.retracted is not None:
            retracted = max(0.0, seen.retracted - before.retracted)
        return Sample(
            rate=rate,
            saturated=busy and before.saturated,
            queued=metrics.queued if metrics else None,
            token_usage=metrics.token_usage if metrics else None,
            retracted=retracted,
            completed=float(seen.completed - before.completed),
        )

    def __enter__(self) -> ConcurrencyTuner:
        self.tick()  # the counters at the start: the first interval is measured
        self._ticker.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ticker.stop()
