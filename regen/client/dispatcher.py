"""The one dispatcher of a run: every shard's rows through one queue to every server.

One module over 400 lines on purpose: the queue, the scheduler, retries and quarantine all
read and change the same per-server state on the dispatcher's own loop; split apart, each part
would reach into the others' state. Requests and their wire shapes live in `shard_job` and
`regen.sglang_api`.

Why this shape:

- One FIFO across shards. Each shard is its own Prefect task, but the GPUs must not see
  shard borders: while shard k's last long answers run, shard k+1's rows fill the slots
  they free. Waiting shards are ordered by shard number, so a retried shard goes first.
- Its own thread and event loop. Prefect runs mapped tasks in worker threads, each with
  its own loop, and an aiohttp session is bound to the loop that made it. So the
  dispatcher owns a loop in a thread started by `start()`, with ONE `ClientSession` (one
  connector, keep-alive, limit = slots of the fleet + one probe per server); shard tasks
  hand rows over with `call_soon_threadsafe` and block on a `concurrent.futures.Future`.
- A scheduler, not a worker pool. A slot freeing or a shard arriving calls `_pump`, which
  starts one task per request on the healthy server with the fewest requests in flight
  (ties round robin). Nothing polls and no coroutine sits parked per slot, so an idle
  fleet costs nothing and a busy one well under 1 ms of client CPU per request, most of
  it aiohttp's (benches/dispatch.py measures it).
- Failures by class (SGLANG_API.md): 400-like answers become error rows at once; 401 stops
  the run (`FleetUnauthorized`); 5xx, timeouts, broken connections and answers the server
  cut short (`finish_reason` abort, regen.sglang_api.abort: never a row, counted per server
  in `stats()`'s `cut_answers`) are retried with jittered backoff up to
  `generation.max_attempts`, on another server than the one that failed the row while
  another is healthy (a retry waits for its slot rather than return).
- Quarantine. `quarantine_after` consecutive transport failures take a server out; its
  other in-flight requests are cancelled and requeued at once *without* counting an
  attempt (they did not fail, their server did). The failures themselves do count, so a
  prompt that crashes every server it touches ends as an error row instead of taking the
  whole fleet down. A quarantined server is re-probed with backoff and comes back when
  the probe passes (a 401 to its probe stops the run, as a request's does: the server came
  back with another key). No healthy server for `generation.fleet_dead_s` fails every pending
  future with `FleetError`; shards already returned are unaffected.
- Quarantine by the caller (`quarantine(server, reason)`): the live audit found a server
  whose answers are bad (a broken GPU, a corrupted staged copy) although it answers fast
  and passes every probe. It leaves the same way, its in-flight rows re-sent to the others
  at no attempt's cost (their answers would be suspect), but it is never re-probed: it
  stays out for the run, with its reason in `stats()`.
- Relaunch (`supervised`). The fleet's supervisor takes a server it relaunches out (`hold`:
  its in-flight rows re-sent elsewhere at no attempt's cost) and back once its probes pass
  (`restore`), or out for good (`retire`). Such a fleet is gone only when no server can serve
  and none can come back, and then at once (`FleetGone`), not after `fleet_dead_s`: a server
  being relaunched is not gone. `stats()` gives each server's last answer, its evidence.
- Conversations (`regeneration.turns: all`). A row's next turn is sent the moment its
  previous answer arrives, ahead of fresh rows, so a conversation never waits on other rows
  and slots stay full. Each turn has its own attempts and rid (`turn_request_id`).
- Affinity. That next turn goes to the server that answered the last one, whose radix cache
  holds the conversation (SGLang prefills only the uncached part), while it is healthy and at
  most `affinity_slack` of its slots busier than the least loaded healthy server; else to the
  front of the retry queue, for the least loaded. Least-loaded alone keeps a turn home only
  while the fleet is saturated (the freed slot is the only one); as conversations thin out it
  sends turns round the fleet (benches/affinity.py counts both).
- Hedging the tail. Once nothing is queued, a free slot takes a second copy (its own rid)
  of a straggler: a request that has run `hedge_after` times its server's mean request time,
  on a server measured at most `hedge_slow_ratio` as fast as the free one (per-request
  tokens/s of its answers). The first answer settles the turn, exactly once; the other copy
  is aborted by rid on its server (POST /abort_request; SGLang cuts every rid the given one
  prefixes, and regen's rids are prefix-free, so an abort cuts that copy alone) and its slot
  counts as busy until the abort's answer comes back. A copy that fails while the other runs
  is dropped, not retried.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType

import aiohttp
import polars as pl
from pydantic import SecretStr

from regen.client.setting import SettingDraw
from regen.client.shard_job import ShardJob
from regen.client.stats import DispatchStats, ServerState, ServerStats
from regen.client.timeouts import RequestTimeout
from regen.client.tuning import DispatchTuning
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.errors import FleetError, FleetGone, FleetUnauthorized
from regen.sglang_api.answer import Answer, read_answer
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeSettings, ProbeTarget, reprobe
from regen.sglang_api.request import auth_headers, chat_request_body, turn_request_id
from regen.sglang_api.response import ResponseKind

log = logging.getLogger(__name__)

Reprobe = Callable[[Endpoint], Awaitable[bool]]
# The transport: given the connection limit and the headers every request carries, a session
# for the dispatcher's loop (called there, closed by the dispatcher). Tests pass one that adds
# trace hooks; the default is `keepalive_session`.
SessionFactory = Callable[[int, dict[str, str]], aiohttp.ClientSession]


def keepalive_session(limit: int, headers: dict[str, str]) -> aiohttp.ClientSession:
    """One keep-alive connector of `limit` connections over every server."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
    # Headers set once on the session: merging them per request costs CPU.
    return aiohttp.ClientSession(connector=connector, headers=headers)


class _Work:
    """One row on its way: where it lives in its shard and how it has fared."""

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


class _Server:
    """Loop-thread state of one endpoint; `running` maps each request task to its row."""

    __slots__ = (
        "completed",
        "consecutive_failures",
        "cut_answers",
        "endpoint",
        "failed_attempts",
        "last_answer",
        "last_failure",
        "output_tokens",
        "probe",
        "quarantine_reason",
        "quarantines",
        "running",
        "samples",
        "since",
        "slots",
        "speed",
        "state",
        "tokens",
        "took",
    )

    def __init__(self, endpoint: Endpoint, slots: int) -> None:
        self.endpoint = endpoint
        self.slots = slots
        self.state = ServerState.HEALTHY
        self.running: dict[asyncio.Task[None], _Work] = {}
        self.since: dict[asyncio.Task[None], float] = {}  # when each request was sent
        # Measured from its answers, for hedging: per-request decode speed (tokens/s) and
        # request time (s), both EWMAs, and how many answers they rest on.
        self.speed = 0.0
        self.tokens = 0.0
        self.took = 0.0
        self.samples = 0
        self.consecutive_failures = 0
        self.last_failure = ""
        self.last_answer: float | None = None
        self.completed = 0
        self.failed_attempts = 0
        self.cut_answers = 0
        self.output_tokens = 0
        self.quarantines = 0
        self.quarantine_reason: str | None = None
        self.probe: asyncio.Task[None] | None = None

    @property
    def healthy(self) -> bool:
        return self.state is ServerState.HEALTHY


class Dispatcher:
    """Send shards of rows to a fleet; see the module docstring for the design."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        *,
        api_key: SecretStr,
        model: str,
        sampling: SamplingConfig,
        generation: GenerationConfig,
        concurrency_per_server: int,
        regeneration: RegenerationConfig | None = None,
        reprobe: Reprobe | None = None,
        tuning: DispatchTuning | None = None,
        session: SessionFactory = keepalive_session,
        supervised: bool = False,
    ) -> None:
        if not endpoints:
            raise ValueError("Dispatcher needs at least one endpoint")
        if concurrency_per_server < 1:
            raise ValueError("concurrency_per_server must be >= 1")
        self._servers = [_Server(e, concurrency_per_server) for e in endpoints]
        self._model = model
        self._sampling = sampling
        self._regeneration = regeneration or RegenerationConfig()
        self._setting = SettingDraw(sampling, self._regeneration)
        self._generation = generation
        self._tuning = tuning or DispatchTuning()
        self._reprobe = reprobe
        self._make_session = session
        self._supervised = supervised
        self._last_out: _Server | None = None  # the last server taken out for good
        self._api_key = api_key
        self._headers = {"Content-Type": "application/json", **auth_headers(api_key)}
        self._timeout = RequestTimeout(
            sampling.max_tokens, self._tuning, generation.request_timeout_s
        )
        self._client_timeout = aiohttp.ClientTimeout(total=self._timeout.seconds)
        self._random = random.Random()
        self._lock = threading.Lock()  # guards the counters stats() reads from other threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        # Loop-thread state.
        self._waiting: list[tuple[int, int, ShardJob]] = []  # heap by (shard, arrival)
        self._current: ShardJob | None = None
        self._retry: deque[_Work] = deque()
        self._open_jobs: set[ShardJob] = set()
        self._arrivals = 0
        self._rr = 0
        self._fatal: BaseException | None = None
        self._dead_timer: asyncio.TimerHandle | None = None
        self._dead_since: float | None = None
        self._hedge_timer: asyncio.TimerHandle | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()  # aborts sent to servers
        # Counters (written in the loop thread under _lock).
        self._submitted = 0
        self._sent = 0
        self._ok = 0
        self._failed = 0
        self._aborted = 0
        self._retries = 0
        self._output_tokens = 0
        self._spare = 0  # requests in flight that no row waits on (a hedge's second copy)
        self._hedged = 0
        self._hedge_wins = 0
        self._home_turns = 0
        self._moved_turns = 0

    # ---- caller side (any thread) -------------------------------------------------------

    def start(self) -> Dispatcher:
        if self._loop is not None:
            raise RuntimeError("Dispatcher already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._serve, args=(loop,), name="regen-dispatcher", daemon=True
        )
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), loop).result()
        return self

    def close(self) -> None:
        """Fail what is still pending, close the session, stop the loop thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or self._closed:
            return
        self._closed = True
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def __enter__(self) -> Dispatcher:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def submit_shard(
        self, shard: int, rows: pl.DataFrame
    ) -> concurrent.futures.Future[pl.DataFrame]:
        """Queue a shard's rows (`id`, `messages`); the future gives `row_schema()` rows in
        input order, one per id, or raises `FleetError` / `FleetUnauthorized`."""
        if self._loop is None or self._closed:
            raise RuntimeError("Dispatcher is not running (call start() first)")
        regen = self._regeneration
        job = ShardJob(
            shard,
            rows,
            turns=regen.turns,
            keep_reasoning=regen.thinking == "save",
            efforts=regen.reasoning_effort,
            setting=self._setting,
        )
        if job.size:
            self._loop.call_soon_threadsafe(self._accept, job)
        return job.future

    def abort(self, error: BaseException) -> None:
        """Fail every queued and in-flight row with `error` and cancel their requests, at once:
        the live gate stopped the run, and every further answer is GPU time spent on nothing.
        Rows submitted later are still served."""
        if self._loop is None or self._closed:
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def apply() -> None:
            self._abort_all(error)
            done.set_result(None)

        self._loop.call_soon_threadsafe(apply)
        done.result()

    def quarantine(self, server: str | int, reason: str) -> None:
        """Take a server out for the rest of the run: by name (`server-1`) or index.

        Its in-flight rows go to the other servers, none lost and none counted twice; its
        completed rows stay where they are (the caller decides what to do with them). Raises
        ValueError for an unknown server or for the last one that could still serve: the run
        must stop instead, which is the caller's call, not a dead fleet's timeout.
        """
        if self._loop is None or self._closed:
            raise RuntimeError("Dispatcher is not running (call start() first)")
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def apply() -> None:
            try:
                self._hold_out(self._server(server), reason)
                done.set_result(None)
            except ValueError as err:
                done.set_exception(err)

        self._loop.call_soon_threadsafe(apply)
        done.result()

    def hold(self, server: str | int, reason: str) -> None:
        """Take a server out until `restore` (its owner relaunches it): its in-flight rows go
        to the others at no attempt's cost, and it is not gone. No-op once out for good."""
        self._on_loop(lambda: self._hold(self._server(server), reason))

    def restore(self, server: str | int) -> None:
        """Put a held server back (its relaunch passed its probes)."""
        self._on_loop(lambda: self._restore(self._server(server)))

    def retire(self, server: str | int, reason: str) -> None:
        """Take a server out for good, the last one too (its owner could not bring it back):
        with no server left that can serve or come back, every pending row fails at once
        with `FleetGone`, whose message is the last one's `reason`."""
        self._on_loop(lambda: self._hold_out(self._server(server), reason, retired=True))

    def _on_loop(self, apply: Callable[[], None]) -> None:
        """Run `apply` on the loop thread and wait for it; a no-op once closed."""
        if self._loop is None or self._closed:
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                apply()
                done.set_result(None)
            except Exception as err:
                done.set_exception(err)

        self._loop.call_soon_threadsafe(run)
        done.result()

    def stats(self) -> DispatchStats:
        """A consistent snapshot of the counters; cheap enough to call every second."""
        with self._lock:
            servers = tuple(
                ServerStats(
                    name=s.endpoint.name,
                    url=s.endpoint.url,
                    state=s.state,
                    in_flight=len(s.running),
                    slots=s.slots,
                    completed=s.completed,
                    failed_attempts=s.failed_attempts,
                    output_tokens=s.output_tokens,
                    quarantines=s.quarantines,
                    quarantine_reason=s.quarantine_reason,
                    last_answer=s.last_answer,
                    cut_answers=s.cut_answers,
                )
                for s in self._servers
            )
            in_flight = sum(s.in_flight for s in servers) - self._spare  # rows, not copies
            queued = self._submitted - self._ok - self._failed - self._aborted - in_flight
            return DispatchStats(
                monotonic=time.monotonic(),
                submitted=self._submitted,
                queued=max(queued, 0),
                in_flight=in_flight,
                ok=self._ok,
                failed=self._failed,
                retries=self._retries,
                output_tokens=self._output_tokens,
                request_timeout_s=self._timeout.seconds,
                servers=servers,
                sent=self._sent,
                hedged=self._hedged,
                hedge_wins=self._hedge_wins,
                home_turns=self._home_turns,
                moved_turns=self._moved_turns,
            )

    # ---- loop thread ------------------------------------------------------------------

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    async def _open(self) -> None:
        slots = sum(s.slots for s in self._servers)
        self._session = self._make_session(slots + len(self._servers), self._headers)

    async def _shutdown(self) -> None:
        self._abort_all(FleetError("dispatcher closed before the shard finished"))
        for server in self._servers:
            if server.probe is not None:
                server.probe.cancel()
        if self._dead_timer is not None:
            self._dead_timer.cancel()
        if self._hedge_timer is not None:
            self._hedge_timer.cancel()
        for side in self._side_tasks:
            side.cancel()
        pending = [s.probe for s in self._servers if s.probe is not None]
        pending += list(self._side_tasks)
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _accept(self, job: ShardJob) -> None:
        if self._fatal is not None or self._closed:
            job.abort(self._fatal or FleetError("dispatcher closed"))
            return
        with self._lock:
            self._submitted += job.size
        self._arrivals += 1
        heapq.heappush(self._waiting, (job.shard, self._arrivals, job))
        self._open_jobs.add(job)
        self._pump()

    def _pump(self) -> None:
        """Fill every free slot of every healthy server while there is work; a server left
        only retries it failed itself is passed over for the others."""
        passed: set[int] = set()
        while True:
            server = self._pick(passed)
            if server is None:
                return
            work = self._take(server)
            if work is None:
                if self._retry:
                    passed.add(server.endpoint.index)
                    continue
                self._hedge()
                return
            self._launch(work, server)

    def _pick(self, passed: set[int]) -> _Server | None:
        servers = self._servers
        n = len(servers)
        best: _Server | None = None
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

    def _take(self, server: _Server) -> _Work | None:
        """Retries first, each on another server than the one that failed it while another is
        healthy: a server that cuts, drops or fails every answer would otherwise spend a row's
        attempts at the tail, where it is the one with free slots. The retry waits for a slot
        of another server (one request's time at most) rather than return there."""
        retry = self._retry
        if retry:
            alone = sum(s.healthy for s in self._servers) == 1
            for i, queued in enumerate(retry):
                if alone or queued.avoid != server.endpoint.index:
                    del retry[i]
                    return queued
        return self._take_fresh()

    def _take_fresh(self) -> _Work | None:
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
        return _Work(job, pos)

    def _launch(self, work: _Work, server: _Server, *, hedge: bool = False) -> None:
        """Send `work` to `server`; a hedge is a second copy of a turn in flight elsewhere,
        under its own rid, and spends no attempt."""
        if not hedge:
            work.attempts += 1
        if not work.sent and work.job.turn_of(work.pos) == 1:
            work.sent = True
            with self._lock:
                self._sent += 1
        job, pos = work.job, work.pos
        rid = turn_request_id(job.ids[pos], job.turn_of(pos), work.attempts, hedge=hedge)
        assert self._loop is not None
        # The task is named by its rid: an abort names the request by it.
        task = self._loop.create_task(self._attempt(work, server, rid), name=rid)
        server.running[task] = work
        server.since[task] = time.monotonic()
        work.copies += 1

    async def _attempt(self, work: _Work, server: _Server, rid: str) -> None:
        job, pos = work.job, work.pos
        body = json.dumps(
            chat_request_body(
                self._model,
                job.prompt(pos),
                self._sampling,
                rid=rid,
                regeneration=self._regeneration,
                reasoning_effort=job.effort(pos),
                setting=job.setting(pos),
                tools=job.tools(pos),
            )
        ).encode()
        if self._client_timeout.total != self._timeout.seconds:
            self._client_timeout = aiohttp.ClientTimeout(total=self._timeout.seconds)
        timeout = self._client_timeout
        assert self._session is not None
        started = time.monotonic()
        status = 0
        raw = b""
        failure = ""
        unexpected = ""
        try:
            async with self._session.post(
                server.endpoint.chat_url, data=body, timeout=timeout
            ) as resp:
                status = resp.status
                raw = await resp.read()
        except TimeoutError:
            failure = f"timeout after {timeout.total:g} s"
        except (aiohttp.ClientError, OSError) as err:
            failure = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        except Exception as err:  # a client bug must cost one attempt, never hang the shard
            log.exception("unexpected error sending %s to %s", rid, server.endpoint.name)
            unexpected = f"unexpected {type(err).__name__}: {err}"
        latency = time.monotonic() - started
        if status:
            server.last_answer = started + latency  # alive, whatever it answered
        task = asyncio.current_task()
        if server.running.pop(task, None) is None:  # type: ignore[arg-type]
            return  # quarantine or shutdown took this row back while we waited
        server.since.pop(task, None)  # type: ignore[arg-type]
        self._drop_copy(work)
        answer = None if failure or unexpected or work.settled else read_answer(status, raw)
        good = answer is not None and answer.kind is ResponseKind.OK
        if work.settled or (work.copies and not good):
            # A hedge's other copy: the row has its answer (this one's is dropped, be it the
            # abort's), or the copy still running decides it. A broken connection still counts
            # against the server.
            if failure:
                self._count_failure(server, failure)
            elif not unexpected and status == 200:
                server.consecutive_failures = 0
            self._pump()
            return
        if failure:
            self._transport_failure(work, server, failure, latency)
        elif unexpected or answer is None:
            self._retry_or_fail(work, server, unexpected, latency)
        else:
            server.consecutive_failures = 0
            self._answer(work, server, answer, latency)
        self._pump()

    def _answer(self, work: _Work, server: _Server, answer: Answer, latency: float) -> None:
        kind = answer.kind
        if kind is ResponseKind.OK:
            completion = answer.completion
            assert completion is not None
            tokens = completion.completion_tokens or 0
            self._timeout.observe(tokens, latency)
            self._observe(server, tokens, latency)
            if work.copies and server.endpoint.index == work.hedged_to:
                with self._lock:
                    self._hedge_wins += 1  # the copy beat the straggler
            self._settle(work)
            more = work.job.complete(
                work.pos, completion, server.endpoint.name, work.attempts, latency
            )
            with self._lock:
                self._ok += 0 if more else 1  # rows, not turns: `queued` counts rows
                self._output_tokens += tokens
                server.completed += 1
                server.output_tokens += tokens
            if more:
                # The next turn goes first: its conversation waits on nothing else. It stays
                # on this server, whose radix cache holds the conversation so far, unless the
                # server is much busier than the rest.
                turn = _Work(work.job, work.pos, home=server.endpoint.index)
                if self._stays_home(server):
                    with self._lock:
                        self._home_turns += 1
                    self._launch(turn, server)
                else:
                    with self._lock:
                        self._moved_turns += 1
                    self._retry.appendleft(turn)
            self._forget_if_done(work.job)
        elif kind is ResponseKind.REJECTED:
            self._fail_row(work, answer.reason, server, latency)
        elif kind is ResponseKind.UNAUTHORIZED:
            self._die(
                # Where the key came from is the run's to say (a config, a block, generated).
                FleetUnauthorized(
                    f"{server.endpoint.name} ({server.endpoint.url}) answered 401 to a request: "
                    "the API key is wrong"
                )
            )
        else:
            # 5xx, an unreadable 200, an answer the server cut short: the server answered, so
            # it is not quarantined for it, but the row tries again, elsewhere if it can.
            with self._lock:
                server.failed_attempts += 1
                server.cut_answers += answer.cut
            self._retry_or_fail(work, server, answer.reason, latency)

    def _transport_failure(self, work: _Work, server: _Server, reason: str, latency: float) -> None:
        self._retry_or_fail(work, server, reason, latency)
        self._count_failure(server, reason)

    def _count_failure(self, server: _Server, reason: str) -> None:
        """A broken connection or a timeout: enough in a row quarantine the server."""
        server.consecutive_failures += 1
        server.last_failure = reason
        with self._lock:
            server.failed_attempts += 1
        if server.healthy and server.consecutive_failures >= self._tuning.quarantine_after:
            self._quarantine(server)

    def _retry_or_fail(self, work: _Work, server: _Server, reason: str, latency: float) -> None:
        work.avoid = server.endpoint.index
        attempts = work.attempts
        if attempts >= self._generation.max_attempts:
            self._fail_row(work, f"gave up after {attempts} attempts: {reason}", server, latency)
            return
        with self._lock:
            self._retries += 1
        t = self._tuning
        delay = min(t.retry_backoff_max_s, t.retry_backoff_s * 2 ** (attempts - 1))
        assert self._loop is not None
        self._loop.call_later(delay * self._random.uniform(0.5, 1.5), self._requeue, work)

    def _drop_copy(self, work: _Work) -> None:
        """One request of `work` ended or was taken back; what still runs of a settled turn,
        or beside another copy, waits on no row (`_spare`, out of `stats().in_flight`)."""
        work.copies -= 1
        if work.settled or work.copies:
            with self._lock:
                self._spare -= 1

    def _settle(self, work: _Work) -> None:
        """The turn has its answer or its error: exactly once, whatever else of it runs. The
        copies still running are aborted on their servers and end with the abort's answer,
        which is dropped; their slots stay counted until then."""
        work.settled = True
        if not work.copies:
            return
        with self._lock:
            self._spare += work.copies
        assert self._loop is not None
        for server in self._servers:
            for task, other in server.running.items():
                if other is not work:
                    continue
                # SGLang's scheduler aborts every request whose rid starts with this one
                # (scheduler.py abort_request); no rid of regen's is a prefix of another
                # (turn_request_id), so this cuts this copy and nothing else.
                rid = task.get_name()
                side = self._loop.create_task(self._send_abort(server.endpoint, rid))
                self._side_tasks.add(side)
                side.add_done_callback(self._side_tasks.discard)

    async def _send_abort(self, endpoint: Endpoint, rid: str) -> None:
        """POST /abort_request {"rid"}: the server frees the slot and answers the request
        with finish_reason abort. A failed abort costs only that copy's GPU time."""
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=self._tuning.probe_timeout_s)
        try:
            async with self._session.post(
                endpoint.abort_url, json={"rid": rid}, timeout=timeout
            ) as resp:
                await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            log.info("abort of %s on %s failed: %s", rid, endpoint.name, err)

    def _observe(self, server: _Server, tokens: int, latency: float) -> None:
        """A server's measured per-request speed and request time, for hedging: moving
        averages of its answers' tokens and seconds (a plain mean over the first 1/alpha), the
        speed their ratio, so a request's fixed overhead weighs as little as it costs."""
        if tokens <= 0 or latency <= 0:
            return
        server.samples += 1
        alpha = max(self._tuning.speed_ewma_alpha, 1 / server.samples)
        server.tokens += alpha * (tokens - server.tokens)
        server.took += alpha * (latency - server.took)
        server.speed = server.tokens / server.took

    def _stays_home(self, server: _Server) -> bool:
        """Whether a conversation's next turn stays on `server`, which answered its last:
        healthy, a slot free, and at most `affinity_slack` of its slots busier than the
        least loaded healthy server."""
        t = self._tuning
        if not t.affinity or not server.healthy or len(server.running) >= server.slots:
            return False
        least = min(len(s.running) for s in self._servers if s.healthy)
        return len(server.running) - least <= t.affinity_slack * server.slots

    def _hedge(self) -> None:
        """Nothing is queued: give each free slot a copy of a straggler, a request that has
        run `hedge_after` times its server's mean request time on a server at most
        `hedge_slow_ratio` as fast as the free one, oldest first. Arms a timer for the next
        request that will become one."""
        t = self._tuning
        if not t.hedge or self._fatal is not None:
            return
        if self._hedge_timer is not None:
            self._hedge_timer.cancel()
            self._hedge_timer = None
        now = time.monotonic()
        wake = float("inf")
        free = sorted(
            (s for s in self._servers if s.healthy and len(s.running) < s.slots),
            key=lambda s: -s.speed,
        )
        for target in free:
            if target.samples < t.hedge_min_samples:
                continue
            while len(target.running) < target.slots:
                best: tuple[float, _Work] | None = None
                for source in self._servers:
                    if (
                        source is target
                        or source.samples < t.hedge_min_samples
                        or source.speed > t.hedge_slow_ratio * target.speed
                    ):
                        continue
                    due = t.hedge_after * source.took
                    for task, work in source.running.items():
                        if work.copies != 1 or work.settled or not work.job.is_open():
                            continue
                        ran = now - source.since[task]
                        if ran < due:
                            wake = min(wake, source.since[task] + due)
                        elif best is None or ran > best[0]:
                            best = (ran, work)
                if best is None:
                    break
                work = best[1]
                work.hedged_to = target.endpoint.index
                with self._lock:
                    self._hedged += 1
                    self._spare += 1  # one row, now two requests
                self._launch(work, target, hedge=True)
        if wake < float("inf") and any(len(s.running) < s.slots for s in free):
            assert self._loop is not None
            self._hedge_timer = self._loop.call_at(
                self._loop.time() + max(0.0, wake - now), self._pump
            )

    def _requeue(self, work: _Work) -> None:
        if work.job.is_open() and self._fatal is None:
            self._retry.append(work)
            self._pump()

    def _fail_row(self, work: _Work, error: str, server: _Server, latency: float) -> None:
        self._settle(work)
        with self._lock:
            self._failed += 1
        work.job.fail(work.pos, error, server.endpoint.name, work.attempts, latency)
        self._forget_if_done(work.job)

    def _forget_if_done(self, job: ShardJob) -> None:
        if not job.is_open():
            self._open_jobs.discard(job)
            if self._current is job:
                self._current = None

    def _quarantine(
        self,
        server: _Server,
        reason: str = "",
        *,
        reprobe: bool = True,
        state: ServerState = ServerState.QUARANTINED,
    ) -> None:
        server.state = state
        taken = list(server.running.items())
        with self._lock:
            server.quarantines += 1
            server.running.clear()
        server.since.clear()
        for task, work in taken:
            task.cancel()
            self._drop_copy(work)
            if work.settled or work.copies:
                continue  # a hedge's other copy has the row, or has answered it
            work.attempts = max(0, work.attempts - 1)  # its server failed, not the row
            work.avoid = server.endpoint.index
            self._retry.append(work)
        if not reason:
            reason = f"{server.consecutive_failures} consecutive failures ({server.last_failure})"
        log.warning(
            "%s %s: %s; %d requests moved elsewhere",
            server.endpoint.name,
            "quarantined" if state is ServerState.QUARANTINED else "taken out",
            reason,
            len(taken),
        )
        assert self._loop is not None
        if reprobe:
            server.probe = self._loop.create_task(self._reprobe_until_healthy(server))
        self._check_fleet()
        self._pump()

    def _server(self, name: str | int) -> _Server:
        for s in self._servers:
            if name in (s.endpoint.name, s.endpoint.index):
                return s
        known = ", ".join(s.endpoint.name for s in self._servers)
        raise ValueError(f"no server {name!r} in this dispatcher ({known})")

    def _hold_out(self, server: _Server, reason: str, *, retired: bool = False) -> None:
        if server.quarantine_reason is not None:
            return  # already out: the first reason stands
        # A transport-quarantined server may come back; one held out never does.
        left = [s for s in self._servers if s is not server and s.quarantine_reason is None]
        if not left and not retired:
            raise ValueError(
                f"{server.endpoint.name} is the last server that can serve; stop the run instead"
            )
        if server.probe is not None:
            server.probe.cancel()
            server.probe = None
        with self._lock:
            server.quarantine_reason = reason
        self._last_out = server
        if server.healthy:
            self._quarantine(server, reason, reprobe=False)
        else:
            server.state = ServerState.QUARANTINED
            if not retired:  # a retiring owner has said why, in its one line
                log.warning("%s held out for the rest of the run: %s", server.endpoint.name, reason)
            self._check_fleet()

    def _hold(self, server: _Server, reason: str) -> None:
        if server.quarantine_reason is not None or server.state is ServerState.RELAUNCHING:
            return
        if server.probe is not None:
            server.probe.cancel()  # its owner brings it back, not a re-probe
            server.probe = None
        if server.healthy:
            self._quarantine(server, reason, reprobe=False, state=ServerState.RELAUNCHING)
        else:
            server.state = ServerState.RELAUNCHING
            self._check_fleet()

    def _restore(self, server: _Server) -> None:
        if server.state is ServerState.RELAUNCHING and server.quarantine_reason is None:
            self._readmit(server, "is back in the fleet")

    async def _reprobe_until_healthy(self, server: _Server) -> None:
        t = self._tuning
        delay = t.probe_backoff_s
        while True:
            await asyncio.sleep(delay * self._random.uniform(0.8, 1.2))
            try:
                passed = await self._probe(server.endpoint)
            except FleetUnauthorized as err:
                # Back, but refusing the key (restarted with another one): every request
                # would be refused too, so the run stops rather than re-probe it for ever.
                if not self._closed:
                    self._die(err)
                return
            if self._closed:
                # _shutdown cancelled this task, but a cancel that lands as its probe
                # finishes can be lost (Python 3.11's wait_for, bpo-42130): the loop went on
                # re-probing and close() waited for it for ever. The closed flag ends it.
                return
            if passed:
                break
            delay = min(delay * 2, t.probe_backoff_max_s)
        server.probe = None
        self._readmit(server, "passed its probe and is back in the fleet")

    def _readmit(self, server: _Server, how: str) -> None:
        server.state = ServerState.HEALTHY
        server.consecutive_failures = 0
        log.warning("%s %s", server.endpoint.name, how)
        self._check_fleet()
        self._pump()

    async def _probe(self, endpoint: Endpoint) -> bool:
        timeout = self._tuning.probe_timeout_s
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel that lands
        # as the probe ends, and close() then waits on a probe loop that never stops.
        try:
            if self._reprobe is not None:
                async with asyncio.timeout(timeout):
                    return await self._reprobe(endpoint)
            # Without a fleet's own re-probe, the probe a fleet's launch uses, each of its
            # steps within the one re-probe deadline.
            assert self._session is not None
            settings = ProbeSettings(
                health_timeout_s=timeout, models_timeout_s=timeout, generation_timeout_s=timeout
            )
            target = ProbeTarget(self._model, self._api_key, self._sampling)
            async with asyncio.timeout(timeout):
                result = await reprobe(endpoint, target, settings, self._session)
        except TimeoutError:
            return False
        return result.ok

    def _check_fleet(self) -> None:
        """Arm the fleet-dead timer when the last healthy server goes, disarm when one returns;
        a fleet none of whose servers can come back is gone at once, and a supervised one
        only then (its supervisor brings each server back or retires it)."""
        assert self._loop is not None
        if any(s.healthy for s in self._servers):
            self._dead_since = None
            if self._dead_timer is not None:
                self._dead_timer.cancel()
                self._dead_timer = None
        elif all(s.quarantine_reason is not None for s in self._servers):
            self._die(FleetGone(self._gone_line()))
        elif self._dead_since is None and not self._supervised:
            self._dead_since = time.monotonic()
            self._dead_timer = self._loop.call_later(
                self._generation.fleet_dead_s, self._fleet_dead
            )

    def _gone_line(self) -> str:
        last = self._last_out or self._servers[-1]
        others = [s.endpoint.name for s in self._servers if s is not last]
        before = f"; out before it: {', '.join(others)}" if others else ""
        return f"fleet gone: {last.endpoint.name} {last.quarantine_reason}{before}"

    def _fleet_dead(self) -> None:
        reasons = "; ".join(f"{s.endpoint.name}: {s.last_failure}" for s in self._servers)
        self._die(
            FleetError(f"no healthy server for {self._generation.fleet_dead_s:g} s ({reasons})")
        )

    def _die(self, error: FleetError) -> None:
        if self._fatal is None:
            # A fleet gone was said server by server as each went out (`stays out ...`), and
            # the run's one line says it again whole: not a third time here.
            if not isinstance(error, FleetGone):
                log.error("%s", error)
            self._fatal = error
        for server in self._servers:
            if server.probe is not None:
                server.probe.cancel()
                server.probe = None
        self._abort_all(error)

    def _abort_all(self, error: BaseException) -> None:
        for server in self._servers:
            for task in server.running:
                task.cancel()
            server.since.clear()
            with self._lock:
                server.running.clear()
        with self._lock:
            self._spare = 0
        pending = 0
        for job in self._open_jobs:
            pending += job.remaining
            job.abort(error)
        with self._lock:
            self._aborted += pending
        self._open_jobs.clear()
        self._waiting.clear()
        self._retry.clear()
        self._current = None
