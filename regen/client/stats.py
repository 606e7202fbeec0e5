"""Immutable snapshots of the dispatcher's counters, safe to hand to any thread."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ServerState(StrEnum):
    HEALTHY = "healthy"
    QUARANTINED = "quarantined"
    RELAUNCHING = "relaunching"
    """Taken out by its owner (`Dispatcher.hold`) until it is back (`restore`) or out for
    good (`retire`): not gone, so the fleet is not dead while one is coming back."""


@dataclass(frozen=True, slots=True)
class ServerStats:
    """One server's counters; `output_tokens` is cumulative so rates come from two snapshots."""

    name: str
    url: str
    state: ServerState
    in_flight: int
    slots: int
    completed: int
    failed_attempts: int
    output_tokens: int
    quarantines: int
    # Set when a caller took the server out (`Dispatcher.quarantine`): out for the rest of
    # the run, whatever its probes say. None for a transport quarantine, which re-probes.
    quarantine_reason: str | None = None
    last_answer: float | None = None
    """When it last answered a request (any HTTP status), on this process's monotonic clock:
    the evidence a supervisor judges a hang by. None before its first answer."""
    cut_answers: int = 0
    """Answers it cut short (finish_reason abort, or a queued request's abort), each retried:
    never a row. A hedge's own abort of its spare copy is regen's doing and not counted."""


@dataclass(frozen=True, slots=True)
class DispatchStats:
    """Row counters of this dispatcher since `start()`; `done` = `ok` + `failed`."""

    monotonic: float
    submitted: int
    queued: int
    in_flight: int
    ok: int
    failed: int
    retries: int
    output_tokens: int
    request_timeout_s: float
    servers: tuple[ServerStats, ...]
    sent: int = 0
    """Rows sent to a server at least once (a row queued, never sent, is in `submitted`)."""
    hedged: int = 0
    """Second copies sent of a straggler (the tail's hedges); `hedge_wins` answered first."""
    hedge_wins: int = 0
    home_turns: int = 0
    """turns=all: next turns sent to the server that answered the previous one, and those
    `moved_turns` queued for the least loaded instead (the home server was too busy)."""
    moved_turns: int = 0

    @property
    def done(self) -> int:
        return self.ok + self.failed
