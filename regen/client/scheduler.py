"""Deciding: which row goes to which server, and what a reply does to its row.

Pure logic over the fleet's state (regen.client.state): no I/O, no event loop, no clock but
the one it is given, so it can be driven by hand (tests/test_scheduler.py). The dispatcher
calls it on its loop and carries out what it decided, left in its outboxes: `launched`
(requests to send), `taken` (to cancel), `cut` (copies to abort on their servers), `retries`
(rows to requeue after a delay), `probing` (servers to start or stop re-probing), `down` (the
fleet-dead clock runs) and `rearm`/`wake_in` (the hedge timer). Servers that fail or are
taken out: regen.client.health; the tail's second copies: regen.client.hedging.

- A scheduler, not a worker pool. A slot freeing or a shard arriving calls `pump`, which
  launches one request per free slot on the healthy server with the fewest in flight (ties
  round robin), retries first, then the waiting shards in shard order.
- Failures by class (SGLANG_API.md): 400-like answers become error rows at once; 401 stops
  the run (`FleetUnauthorized`); 5xx, timeouts, broken connections and answers the server
  cut short (`finish_reason` abort, regen.sglang_api.abort: never a row) are retried with
  jittered backoff up to `generation.max_attempts`, on another server than the one that
  failed the row while another is healthy (a retry waits for its slot rather than return).
- Conversations (`regeneration.turns: all`). A row's next turn is sent the moment its
  previous answer arrives, ahead of fresh rows, so a conversation never waits on other rows
  and slots stay full. Each turn has its own attempts and rid (`turn_request_id`).
- Affinity. That next turn goes to the server that answered the last one, whose radix cache
  holds the conversation (SGLang prefills only the uncached part), while it is healthy and at
  most `affinity_slack` of its slots busier than the least loaded healthy server; else to the
  front of the retry queue, for the least loaded. Least-loaded alone keeps a turn home only
  while the fleet is saturated (the freed slot is the only one); as conversations thin out it
  sends turns round the fleet (benches/affinity.py counts both).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Callable

from regen.client.counters import Counters
from regen.client.health import Health
from regen.client.hedging import observe, straggler
from regen.client.send import Reply, backoff
from regen.client.shard_job import ShardJob
from regen.client.state import Flight, Server, Work
from regen.client.timeouts import RequestTimeout
from regen.client.tuning import DispatchTuning
from regen.errors import FleetUnauthorized
from regen.sglang_api.answer import Answer
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import turn_request_id
from regen.sglang_api.response import ResponseKind

log = logging.getLogger(__name__)


class Scheduler:
    """The queue and the fleet's state, and every decision over them; see the module doc."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        slots: int,
        *,
        tuning: DispatchTuning,
        max_attempts: int,
        timeout: RequestTimeout,
        counters: Counters | None = None,
        supervised: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.servers = [Server(e, slots) for e in endpoints]
        self.tuning = tuning
        self.counters = counters or Counters()
        self.health = Health(self, supervised=supervised)
        self._max_attempts = max_attempts
        self._timeout = timeout
        self._clock = clock
        self.fatal: BaseException | None = None
        self.retry: deque[Work] = deque()  # rows to send again (and next turns), first first
        self.open_jobs: set[ShardJob] = set()
        self._waiting: list[tuple[int, int, ShardJob]] = []  # heap by (shard, arrival)
        self._current: ShardJob | None = None
        self._arrivals = 0
        self._rr = 0
        # Outboxes: what the caller carries out after each call (see the module doc).
        self.launched: list[Flight] = []
        self.taken: list[Flight] = []
        self.cut: list[Flight] = []
        self.retries: list[tuple[float, Work]] = []
        self.probing: dict[Server, bool] = {}  # start (True) or stop re-probing
        self.down = False
        self.rearm = False
        self.wake_in: float | None = None

    def server(self, name: str | int) -> Server:
        """A server by name (`server-1`) or index; ValueError for an unknown one."""
        for s in self.servers:
            if name in (s.endpoint.name, s.endpoint.index):
                return s
        known = ", ".join(s.endpoint.name for s in self.servers)
        raise ValueError(f"no server {name!r} in this dispatcher ({known})")

    # ---- the queue --------------------------------------------------------------------

    def accept(self, job: ShardJob) -> None:
        with self.counters.lock:
            self.counters.submitted += job.size
        self._arrivals += 1
        heapq.heappush(self._waiting, (job.shard, self._arrivals, job))
        self.open_jobs.add(job)
        self.pump()

    def requeue(self, work: Work) -> None:
        """A failed row's backoff is over."""
        if work.job.is_open() and self.fatal is None:
            self.retry.append(work)
            self.pump()

    def pump(self) -> None:
        """Fill every free slot of every healthy server while there is work; a server left
        only retries it failed itself is passed over for the others."""
        passed: set[int] = set()
        while True:
            server = self._pick(passed)
            if server is None:
                return
            work = self._take(server)
            if work is None:
                if self.retry:
                    passed.add(server.endpoint.index)
                    continue
                self._hedge()
                return
            self._launch(work, server)

    def _pick(self, passed: set[int]) -> Server | None:
        """The healthy server with a free slot and the fewest requests in flight, ties round
        robin."""
        servers = self.servers
        n = len(servers)
        best: Server | None = None
        best_at = 0
        for k in range(n):
            at = (self._rr + k) % n
            s = servers[at]
            if (
                s.healthy
                and s.endpoint.index not in passed
                and len(s.running) < s.slots
                and (best is None or len(s.running) < len(best.running))
            ):
                best, best_at = s, at
        if best is not None:
            self._rr = (best_at + 1) % n
        return best

    def _take(self, server: Server) -> Work | None:
        """Retries first, each on another server than the one that failed it while another is
        healthy: a server that cuts, drops or fails every answer would otherwise spend a row's
        attempts at the tail, where it is the one with free slots. The retry waits for a slot
        of another server (one request's time at most) rather than return there."""
        retry = self.retry
        if retry:
            alone = sum(s.healthy for s in self.servers) == 1
            for i, queued in enumerate(retry):
                if alone or queued.avoid != server.endpoint.index:
                    del retry[i]
                    return queued
        return self._take_fresh()

    def _take_fresh(self) -> Work | None:
        job = self._current
        while job is None or job.cursor >= job.size:
            if not self._waiting:
                self._current = None
                return None
            job = heapq.heappop(self._waiting)[2]
            job.materialize()
            self._current = job
        pos = job.cursor
        job.cursor += 1
        return Work(job, pos)

    def _launch(self, work: Work, server: Server, *, hedge: bool = False) -> None:
        """Send `work` to `server`; a hedge is a second copy of a turn in flight elsewhere,
        under its own rid, and spends no attempt."""
        if not hedge:
            work.attempts += 1
        if not work.sent and work.job.turn_of(work.pos) == 1:
            work.sent = True
            with self.counters.lock:
                self.counters.sent += 1
        job, pos = work.job, work.pos
        rid = turn_request_id(job.ids[pos], job.turn_of(pos), work.attempts, hedge=hedge)
        flight = Flight(work, server, rid, self._clock())
        self.copies(work, +1)
        server.running[flight] = None
        self.launched.append(flight)

    # ---- copies and the spare invariant -----------------------------------------------

    def copies(self, work: Work, change: int = 0, *, settle: bool = False) -> None:
        """The one place a turn's copies in flight or its settling change, and with them
        `Counters.spare`: the requests that no row waits on (out of `stats().in_flight`).
        A turn contributes each copy once settled, else each copy beyond its first."""
        before = work.copies if work.settled else max(work.copies - 1, 0)
        work.copies += change
        work.settled = work.settled or settle
        after = work.copies if work.settled else max(work.copies - 1, 0)
        if after != before:
            with self.counters.lock:
                self.counters.spare += after - before

    def settle(self, work: Work) -> None:
        """The turn has its answer or its error: exactly once, whatever else of it runs. The
        copies still running are cut on their servers and end with the abort's answer, which
        is dropped; their slots stay counted until then."""
        self.copies(work, settle=True)
        if not work.copies:
            return
        for server in self.servers:
            # SGLang's scheduler aborts every request whose rid starts with this one
            # (scheduler.py abort_request); no rid of regen's is a prefix of another
            # (turn_request_id), so an abort by rid cuts this copy and nothing else.
            self.cut.extend(f for f in server.running if f.work is work)

    # ---- affinity and hedging ---------------------------------------------------------

    def stays_home(self, server: Server) -> bool:
        """Whether a conversation's next turn stays on `server`, which answered its last:
        healthy, a slot free, and at most `affinity_slack` of its slots busier than the
        least loaded healthy server."""
        t = self.tuning
        if not t.affinity or not server.healthy or len(server.running) >= server.slots:
            return False
        least = min(len(s.running) for s in self.servers if s.healthy)
        return len(server.running) - least <= t.affinity_slack * server.slots

    def _hedge(self) -> None:
        """Nothing is queued: give each free slot a copy of a straggler (regen.client.hedging),
        the fastest free servers first; sets the hedge timer for the next straggler."""
        t = self.tuning
        if not t.hedge or self.fatal is not None:
            return
        self.rearm, self.wake_in = True, None
        now = self._clock()
        wake = float("inf")
        free = sorted(
            (s for s in self.servers if s.healthy and len(s.running) < s.slots),
            key=lambda s: -s.speed,
        )
        for target in free:
            if target.samples < t.hedge_min_samples:
                continue
            while len(target.running) < target.slots:
                work, due = straggler(self.servers, target, t, now)
                wake = min(wake, due)
                if work is None:
                    break
                work.hedged_to = target.endpoint.index
                with self.counters.lock:
                    self.counters.hedged += 1
                self._launch(work, target, hedge=True)
        if wake < float("inf") and any(len(s.running) < s.slots for s in free):
            self.wake_in = max(0.0, wake - now)

    # ---- replies ----------------------------------------------------------------------

    def landed(self, flight: Flight, reply: Reply) -> None:
        """A request came back with `reply`: settle, retry or drop its row, then refill."""
        server, work = flight.server, flight.work
        if reply.status:
            server.counts.last_answer = reply.started + reply.latency  # alive, whatever it said
        if flight not in server.running:
            return  # a quarantine or an abort took this row back while it ran
        del server.running[flight]
        self.copies(work, -1)
        failure, unexpected = reply.failure, reply.unexpected
        answer = None if work.settled else reply.answer()
        good = answer is not None and answer.kind is ResponseKind.OK
        if work.settled or (work.copies and not good):
            # A hedge's other copy: the row has its answer (this one's is dropped, be it the
            # abort's), or the copy still running decides it. A broken connection still counts
            # against the server.
            if failure:
                self.health.count_failure(server, failure)
            elif not unexpected and reply.status == 200:
                server.consecutive_failures = 0
            self.pump()
            return
        if failure:
            self.retry_or_fail(work, server, failure, reply.latency)
            self.health.count_failure(server, failure)
        elif unexpected or answer is None:
            self.retry_or_fail(work, server, unexpected, reply.latency)
        else:
            server.consecutive_failures = 0
            self._answer(work, server, answer, reply.latency)
        self.pump()

    def _answer(self, work: Work, server: Server, answer: Answer, latency: float) -> None:
        kind = answer.kind
        if kind is ResponseKind.OK:
            completion = answer.completion
            assert completion is not None
            tokens = completion.completion_tokens or 0
            self._timeout.observe(tokens, latency)
            observe(server, tokens, latency, self.tuning)
            c = self.counters
            if work.copies and server.endpoint.index == work.hedged_to:
                with c.lock:
                    c.hedge_wins += 1  # the copy beat the straggler
            self.settle(work)
            more = work.job.complete(
                work.pos, completion, server.endpoint.name, work.attempts, latency
            )
            with c.lock:
                c.ok += 0 if more else 1  # rows, not turns: `queued` counts rows
                c.output_tokens += tokens
                server.counts.completed += 1
                server.counts.output_tokens += tokens
            if more:
                # The next turn goes first: its conversation waits on nothing else. It stays
                # on this server, whose radix cache holds the conversation so far, unless the
                # server is much busier than the rest.
                turn = Work(work.job, work.pos, home=server.endpoint.index)
                if self.stays_home(server):
                    with c.lock:
                        c.home_turns += 1
                    self._launch(turn, server)
                else:
                    with c.lock:
                        c.moved_turns += 1
                    self.retry.appendleft(turn)
            self._forget_if_done(work.job)
        elif kind is ResponseKind.REJECTED:
            self._fail_row(work, answer.reason, server, latency)
        elif kind is ResponseKind.UNAUTHORIZED:
            self.health.die(
                # Where the key came from is the run's to say (a config, a block, generated).
                FleetUnauthorized(
                    f"{server.endpoint.name} ({server.endpoint.url}) answered 401 to a request: "
                    "the API key is wrong"
                )
            )
        else:
            # 5xx, an unreadable 200, an answer the server cut short: the server answered, so
            # it is not quarantined for it, but the row tries again, elsewhere if it can.
            with self.counters.lock:
                server.counts.failed_attempts += 1
                server.counts.cut_answers += answer.cut
            self.retry_or_fail(work, server, answer.reason, latency)

    def retry_or_fail(self, work: Work, server: Server, reason: str, latency: float) -> None:
        """Another attempt after a backoff, on another server while one is healthy, until
        `generation.max_attempts`; then an error row."""
        work.avoid = server.endpoint.index
        attempts = work.attempts
        if attempts >= self._max_attempts:
            self._fail_row(work, f"gave up after {attempts} attempts: {reason}", server, latency)
            return
        with self.counters.lock:
            self.counters.retries += 1
        self.retries.append((backoff(attempts, self.tuning), work))

    def _fail_row(self, work: Work, error: str, server: Server, latency: float) -> None:
        self.settle(work)
        with self.counters.lock:
            self.counters.failed += 1
        work.job.fail(work.pos, error, server.endpoint.name, work.attempts, latency)
        self._forget_if_done(work.job)

    def _forget_if_done(self, job: ShardJob) -> None:
        if not job.is_open():
            self.open_jobs.discard(job)
            if self._current is job:
                self._current = None

    def abort_all(self, error: BaseException) -> None:
        """Fail every queued and in-flight row with `error` and take back their requests."""
        for server in self.servers:
            taken = list(server.running)
            with self.counters.lock:
                server.running.clear()
            for flight in taken:
                self.copies(flight.work, -1)
            self.taken.extend(taken)
        pending = 0
        for job in self.open_jobs:
            pending += job.remaining
            job.abort(error)
        with self.counters.lock:
            self.counters.aborted += pending
        self.open_jobs.clear()
        self._waiting.clear()
        self.retry.clear()
        self._current = None
