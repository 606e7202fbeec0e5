"""The state the scheduler decides over: rows on their way, requests in flight, servers.

Plain values, touched only on the dispatcher's loop (the counters `stats()` reads from other
threads are in `ServerCounts`, under `Counters.lock`).
"""

from __future__ import annotations

from regen.client.counters import ServerCounts
from regen.client.shard_job import ShardJob
from regen.client.stats import ServerState
from regen.sglang_api.endpoint import Endpoint


class Work:
    """One row's current turn on its way: where it lives in its shard and how it has fared."""

    __slots__ = (
        "attempts", "avoid", "copies", "hedged_to", "home", "job", "pos", "sent", "settled",
    )  # fmt: skip

    def __init__(self, job: ShardJob, pos: int, home: int = -1) -> None:
        self.job = job
        self.pos = pos
        self.attempts = 0
        self.sent = False  # reached a server once: counted in `sent`, however often retried
        self.avoid = -1  # the server that last failed this row
        self.home = home  # turns=all: the server that answered this row's previous turn
        self.copies = 0  # requests of this turn in flight: 2 while hedged
        self.settled = False  # this turn has its answer (or its error): later answers are dropped
        self.hedged_to = -1  # the server a hedge copy of this turn went to


class Flight:
    """One request in flight: a copy of a row's turn on a server, named by its rid."""

    __slots__ = ("rid", "server", "since", "work")

    def __init__(self, work: Work, server: Server, rid: str, since: float) -> None:
        self.work = work
        self.server = server
        self.rid = rid
        self.since = since  # when it was sent


class Server:
    """One endpoint's state; `running` holds its requests in flight, oldest first."""

    __slots__ = (
        "consecutive_failures", "counts", "endpoint", "last_failure", "quarantine_reason",
        "running", "samples", "slots", "speed", "state", "tokens", "took",
    )  # fmt: skip

    def __init__(self, endpoint: Endpoint, slots: int) -> None:
        self.endpoint = endpoint
        self.slots = slots
        self.state = ServerState.HEALTHY
        self.running: dict[Flight, None] = {}
        # Measured from its answers, for hedging: per-request decode speed (tokens/s) and
        # request time (s), both EWMAs, and how many answers they rest on.
        self.speed = 0.0
        self.tokens = 0.0
        self.took = 0.0
        self.samples = 0
        self.consecutive_failures = 0
        self.last_failure = ""
        # Set when a caller took it out for good: it never comes back, whatever its probes say.
        self.quarantine_reason: str | None = None
        self.counts = ServerCounts()

    @property
    def healthy(self) -> bool:
        return self.state is ServerState.HEALTHY
