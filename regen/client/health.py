"""Deciding what becomes of a server that fails or is taken out, and of a fleet with none left.

Part of the scheduler (regen.client.scheduler): on its state, through its outboxes, as pure.

- Quarantine. `quarantine_after` consecutive transport failures take a server out; its
  other in-flight requests are cancelled and requeued at once *without* counting an
  attempt (they did not fail, their server did). The failures themselves do count, so a
  prompt that crashes every server it touches ends as an error row instead of taking the
  whole fleet down. A quarantined server is re-probed with backoff and comes back when
  the probe passes (a 401 to its probe stops the run, as a request's does: the server came
  back with another key). No healthy server for `generation.fleet_dead_s` fails every pending
  future with `FleetError`; shards already returned are unaffected.
- Quarantine by the caller (`Dispatcher.quarantine(server, reason)`): the live audit found a
  server whose answers are bad (a broken GPU, a corrupted staged copy) although it answers
  fast and passes every probe. It leaves the same way, its in-flight rows re-sent to the
  others at no attempt's cost (their answers would be suspect), but it is never re-probed: it
  stays out for the run, with its reason in `stats()`.
- Relaunch (`supervised`). The fleet's supervisor takes a server it relaunches out (`hold`:
  its in-flight rows re-sent elsewhere at no attempt's cost) and back once its probes pass
  (`restore`), or out for good (`retire`). Such a fleet is gone only when no server can serve
  and none can come back, and then at once (`FleetGone`), not after `fleet_dead_s`: a server
  being relaunched is not gone. `stats()` gives each server's last answer, its evidence.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Protocol

from regen.client.counters import Counters
from regen.client.state import Flight, Server, Work
from regen.client.stats import ServerState
from regen.client.tuning import DispatchTuning
from regen.errors import FleetError, FleetGone

log = logging.getLogger(__name__)


class Fleet(Protocol):
    """What of the scheduler's state and outboxes this part reads and moves."""

    servers: list[Server]
    counters: Counters
    tuning: DispatchTuning
    retry: deque[Work]
    taken: list[Flight]
    probing: dict[Server, bool]
    down: bool
    fatal: BaseException | None

    def copies(self, work: Work, change: int = 0, *, settle: bool = False) -> None: ...
    def pump(self) -> None: ...
    def abort_all(self, error: BaseException) -> None: ...


class Health:
    """Takes servers out and back in; says when the fleet is down (`Scheduler.down`, the
    dispatcher's fleet-dead clock runs) or gone (every pending row fails at once)."""

    def __init__(self, fleet: Fleet, *, supervised: bool) -> None:
        self._s = fleet
        self._supervised = supervised
        self._last_out: Server | None = None  # the last server taken out for good

    def count_failure(self, server: Server, reason: str) -> None:
        """A broken connection or a timeout: enough in a row quarantine the server."""
        server.consecutive_failures += 1
        server.last_failure = reason
        with self._s.counters.lock:
            server.counts.failed_attempts += 1
        if server.healthy and server.consecutive_failures >= self._s.tuning.quarantine_after:
            self.quarantine(server)

    def quarantine(
        self,
        server: Server,
        reason: str = "",
        *,
        reprobe: bool = True,
        state: ServerState = ServerState.QUARANTINED,
    ) -> None:
        """Take a server out: its requests are taken back and their rows re-sent elsewhere at
        no attempt's cost (they did not fail, their server did)."""
        s = self._s
        server.state = state
        taken = list(server.running)
        with s.counters.lock:
            server.counts.quarantines += 1
            server.running.clear()
        s.taken.extend(taken)
        for flight in taken:
            work = flight.work
            s.copies(work, -1)
            if work.settled or work.copies:
                continue  # a hedge's other copy has the row, or has answered it
            work.attempts = max(0, work.attempts - 1)  # its server failed, not the row
            work.avoid = server.endpoint.index
            s.retry.append(work)
        if not reason:
            reason = f"{server.consecutive_failures} consecutive failures ({server.last_failure})"
        log.warning(
            "%s %s: %s; %d requests moved elsewhere",
            server.endpoint.name,
            "quarantined" if state is ServerState.QUARANTINED else "taken out",
            reason,
            len(taken),
        )
        if reprobe:
            s.probing[server] = True
        self.check_fleet()
        s.pump()

    def hold_out(self, server: Server, reason: str, *, retired: bool = False) -> None:
        """Out for the rest of the run (`Dispatcher.quarantine`, `retire`); ValueError for the
        last server that can serve, unless it is retired."""
        if server.quarantine_reason is not None:
            return  # already out: the first reason stands
        # A transport-quarantined server may come back; one held out never does.
        left = [s for s in self._s.servers if s is not server and s.quarantine_reason is None]
        if not left and not retired:
            raise ValueError(
                f"{server.endpoint.name} is the last server that can serve; stop the run instead"
            )
        self._s.probing[server] = False
        with self._s.counters.lock:
            server.quarantine_reason = reason
        self._last_out = server
        if server.healthy:
            self.quarantine(server, reason, reprobe=False)
        else:
            server.state = ServerState.QUARANTINED
            if not retired:  # a retiring owner has said why, in its one line
                log.warning("%s held out for the rest of the run: %s", server.endpoint.name, reason)
            self.check_fleet()

    def hold(self, server: Server, reason: str) -> None:
        """Out until `restore` (its owner relaunches it); a no-op once out for good."""
        if server.quarantine_reason is not None or server.state is ServerState.RELAUNCHING:
            return
        self._s.probing[server] = False  # its owner brings it back, not a probe
        if server.healthy:
            self.quarantine(server, reason, reprobe=False, state=ServerState.RELAUNCHING)
        else:
            server.state = ServerState.RELAUNCHING
            self.check_fleet()

    def restore(self, server: Server) -> None:
        if server.state is ServerState.RELAUNCHING and server.quarantine_reason is None:
            self.readmit(server, "is back in the fleet")

    def readmit(self, server: Server, how: str) -> None:
        server.state = ServerState.HEALTHY
        server.consecutive_failures = 0
        log.warning("%s %s", server.endpoint.name, how)
        self.check_fleet()
        self._s.pump()

    def check_fleet(self) -> None:
        """Start the fleet-dead clock when the last healthy server goes, stop it when one
        returns; a fleet none of whose servers can come back is gone at once, and a supervised
        one only then (its supervisor brings each server back or retires it)."""
        s = self._s
        if any(x.healthy for x in s.servers):
            s.down = False
        elif all(x.quarantine_reason is not None for x in s.servers):
            self.die(FleetGone(self._gone_line()))
        elif not self._supervised:
            s.down = True

    def _gone_line(self) -> str:
        last = self._last_out or self._s.servers[-1]
        others = [s.endpoint.name for s in self._s.servers if s is not last]
        before = f"; out before it: {', '.join(others)}" if others else ""
        return f"fleet gone: {last.endpoint.name} {last.quarantine_reason}{before}"

    def fleet_dead(self, after_s: float) -> None:
        """The fleet-dead clock ran out: no server came back within `after_s`."""
        reasons = "; ".join(f"{s.endpoint.name}: {s.last_failure}" for s in self._s.servers)
        self.die(FleetError(f"no healthy server for {after_s:g} s ({reasons})"))

    def die(self, error: FleetError) -> None:
        """The run cannot go on: stop re-probing, fail every pending row with `error`."""
        s = self._s
        if s.fatal is None:
            # A fleet gone was said server by server as each went out (`stays out ...`), and
            # the run's one line says it again whole: not a third time here.
            if not isinstance(error, FleetGone):
                log.error("%s", error)
            s.fatal = error
        for server in s.servers:
            s.probing[server] = False
        s.abort_all(error)
