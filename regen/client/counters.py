"""The dispatcher's figures: its counters, written on its loop, read from any thread.

Kept apart from the scheduler that moves them so the one thing other threads touch, the
snapshot `stats()` returns, has one owner and one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sized
from typing import Protocol

from regen.client.stats import DispatchStats, ServerState, ServerStats
from regen.sglang_api.endpoint import Endpoint


class ServerCounts:
    """One server's counters (`ServerStats` less what its state says)."""

    __slots__ = (
        "completed",
        "cut_answers",
        "failed_attempts",
        "last_answer",
        "output_tokens",
        "quarantines",
    )

    def __init__(self) -> None:
        self.completed = 0
        self.failed_attempts = 0
        self.cut_answers = 0
        self.output_tokens = 0
        self.quarantines = 0
        self.last_answer: float | None = None


class CountedServer(Protocol):
    """What a snapshot reads of a server (the scheduler's `Server`)."""

    @property
    def endpoint(self) -> Endpoint: ...
    @property
    def state(self) -> ServerState: ...
    @property
    def slots(self) -> int: ...
    @property
    def running(self) -> Sized: ...
    @property
    def quarantine_reason(self) -> str | None: ...
    @property
    def counts(self) -> ServerCounts: ...


class Counters:
    """The run's row counters. Written on the dispatcher's loop under `lock`, which `snapshot`
    takes to read them all at one instant from another thread."""

    __slots__ = (
        "aborted", "failed", "hedge_wins", "hedged", "home_turns", "lock", "moved_turns", "ok",
        "output_tokens", "retries", "sent", "spare", "submitted",
    )  # fmt: skip

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.submitted = 0
        self.sent = 0
        self.ok = 0
        self.failed = 0
        self.aborted = 0
        self.retries = 0
        self.output_tokens = 0
        # Requests in flight that no row waits on (a hedge's second copy, a settled turn's
        # copy being aborted); moved only by `Scheduler._copies`, which keeps the invariant.
        self.spare = 0
        self.hedged = 0
        self.hedge_wins = 0
        self.home_turns = 0
        self.moved_turns = 0

    def snapshot(self, servers: Iterable[CountedServer], request_timeout_s: float) -> DispatchStats:
        """A consistent snapshot; cheap enough to call every second."""
        with self.lock:
            per_server = tuple(
                ServerStats(
                    name=s.endpoint.name,
                    url=s.endpoint.url,
                    state=s.state,
                    in_flight=len(s.running),
                    slots=s.slots,
                    completed=s.counts.completed,
                    failed_attempts=s.counts.failed_attempts,
                    output_tokens=s.counts.output_tokens,
                    quarantines=s.counts.quarantines,
                    quarantine_reason=s.quarantine_reason,
                    last_answer=s.counts.last_answer,
                    cut_answers=s.counts.cut_answers,
                )
                for s in servers
            )
            in_flight = sum(s.in_flight for s in per_server) - self.spare  # rows, not copies
            queued = self.submitted - self.ok - self.failed - self.aborted - in_flight
            return DispatchStats(
                monotonic=time.monotonic(),
                submitted=self.submitted,
                queued=max(queued, 0),
                in_flight=in_flight,
                ok=self.ok,
                failed=self.failed,
                retries=self.retries,
                output_tokens=self.output_tokens,
                request_timeout_s=request_timeout_s,
                servers=per_server,
                sent=self.sent,
                hedged=self.hedged,
                hedge_wins=self.hedge_wins,
                home_turns=self.home_turns,
                moved_turns=self.moved_turns,
            )
