"""The one dispatcher of a run: every shard's rows through one queue to every server.

The dispatcher owns the event loop's life and the public API; the rest is in parts, each
testable alone:

- deciding, with no I/O: which row goes to which server, retries, affinity
  (regen.client.scheduler), quarantine, relaunch and a dead or gone fleet
  (regen.client.health), the tail's second copies (regen.client.hedging), on the state in
  regen.client.state;
- sending: one request, its deadline, what came back, an abort, a re-probe
  (regen.client.send, regen.client.timeouts);
- its figures: the counters `stats()` snapshots (regen.client.counters, regen.client.stats).

Requests and their wire shapes live in `shard_job` and `regen.sglang_api`.

Why this shape:

- One FIFO across shards. Each shard is its own Prefect task, but the GPUs must not see
  shard borders: while shard k's last long answers run, shard k+1's rows fill the slots
  they free. Waiting shards are ordered by shard number, so a retried shard goes first.
- Its own thread and event loop. Prefect runs mapped tasks in worker threads, each with
  its own loop, and an aiohttp session is bound to the loop that made it. So the
  dispatcher owns a loop in a thread started by `start()`, with ONE `ClientSession` (one
  connector, keep-alive, limit = slots of the fleet + one probe per server); shard tasks
  hand rows over with `call_soon_threadsafe` and block on a `concurrent.futures.Future`.
- Decide, then do. Every event on the loop (a shard arriving, a reply, a timer, a caller's
  hold) is one call into the scheduler, then `_carry_out` of what it decided: tasks started
  or cancelled, aborts sent, timers set. Nothing polls and no coroutine sits parked per
  slot, so an idle fleet costs nothing and a busy one well under 1 ms of client CPU per
  request, most of it aiohttp's (benches/dispatch.py measures it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
from collections.abc import Callable
from types import TracebackType

import polars as pl
from pydantic import SecretStr

from regen.client.counters import Counters
from regen.client.scheduler import Scheduler
from regen.client.send import Reprobe, Sender, SessionFactory, keepalive_session
from regen.client.setting import SettingDraw
from regen.client.shard_job import ShardJob
from regen.client.state import Flight, Server
from regen.client.stats import DispatchStats
from regen.client.timeouts import RequestTimeout
from regen.client.tuning import DispatchTuning
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.errors import FleetError, FleetUnauthorized
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import auth_headers

__all__ = ["Dispatcher", "Reprobe", "SessionFactory", "keepalive_session"]

log = logging.getLogger(__name__)
_ORPHAN_WAIT_S = 2.0  # how long closing waits for others' tasks to take their cancel


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
        slot_cap: int | None = None,
        supervised: bool = False,
    ) -> None:
        if not endpoints:
            raise ValueError("Dispatcher needs at least one endpoint")
        if concurrency_per_server < 1:
            raise ValueError("concurrency_per_server must be >= 1")
        # The most slots set_slots may give a server: the connection pool is sized for it.
        self._slot_cap = max(slot_cap or concurrency_per_server, concurrency_per_server)
        self._model = model
        self._sampling = sampling
        self._regeneration = regeneration or RegenerationConfig()
        self._setting = SettingDraw(sampling, self._regeneration)
        self._generation = generation
        self._tuning = tuning or DispatchTuning()
        self._reprobe = reprobe
        self._make_session = session
        self._api_key = api_key
        self._headers = {"Content-Type": "application/json", **auth_headers(api_key)}
        self._timeout = RequestTimeout(
            sampling.max_tokens, self._tuning, generation.request_timeout_s
        )
        self._counters = Counters()
        self._scheduler = Scheduler(
            endpoints,
            concurrency_per_server,
            tuning=self._tuning,
            max_attempts=generation.max_attempts,
            timeout=self._timeout,
            counters=self._counters,
            supervised=supervised,
        )
        self._random = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sender: Sender | None = None
        self._closed = False
        # Loop-thread state: what carries out the scheduler's decisions.
        self._tasks: dict[Flight, asyncio.Task[None]] = {}  # each request's, by its flight
        self._probes: dict[Server, asyncio.Task[None]] = {}  # re-probe loops
        self._dead_timer: asyncio.TimerHandle | None = None
        self._hedge_timer: asyncio.TimerHandle | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()  # aborts sent to servers

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
            seed=self._sampling.seed,
        )
        if job.size:
            self._loop.call_soon_threadsafe(self._accept, job)
        return job.future

    def abort(self, error: BaseException) -> None:
        """Fail every queued and in-flight row with `error` and cancel their requests, at once:
        the live gate stopped the run, and every further answer is GPU time spent on nothing.
        Rows submitted later are still served."""
        self._on_loop(lambda: self._scheduler.abort_all(error))

    def quarantine(self, server: str | int, reason: str) -> None:
        """Take a server out for the rest of the run: by name (`server-1`) or index.

        Its in-flight rows go to the other servers, none lost and none counted twice; its
        completed rows stay where they are (the caller decides what to do with them). Raises
        ValueError for an unknown server or for the last one that could still serve: the run
        must stop instead, which is the caller's call, not a dead fleet's timeout.
        """
        if self._loop is None or self._closed:
            raise RuntimeError("Dispatcher is not running (call start() first)")
        health = self._scheduler.health
        self._on_loop(lambda: health.hold_out(self._scheduler.server(server), reason))

    def set_slots(self, server: str | int, slots: int) -> None:
        """Keep `slots` requests in flight on a server from now on (by name or index), applied
        when this returns: the concurrency tuner's one lever. More start at once; fewer take
        effect as its requests end, none is cut. ValueError for an unknown server or a count
        outside [1, slot_cap]."""
        if not 1 <= slots <= self._slot_cap:
            raise ValueError(f"slots must be in [1, {self._slot_cap}], got {slots}")
        target = self._scheduler.server(server)
        if self._loop is None or self._closed:
            target.slots = slots
            return

        def apply() -> None:
            with self._counters.lock:
                target.slots = slots
            self._scheduler.pump()

        self._on_loop(apply)

    def hold(self, server: str | int, reason: str) -> None:
        """Take a server out until `restore` (its owner relaunches it): its in-flight rows go
        to the others at no attempt's cost, and it is not gone. No-op once out for good."""
        health, target = self._scheduler.health, self._scheduler.server
        self._on_loop(lambda: health.hold(target(server), reason))

    def restore(self, server: str | int) -> None:
        """Put a held server back (its relaunch passed its probes)."""
        health, target = self._scheduler.health, self._scheduler.server
        self._on_loop(lambda: health.restore(target(server)))

    def retire(self, server: str | int, reason: str) -> None:
        """Take a server out for good, the last one too (its owner could not bring it back):
        with no server left that can serve or come back, every pending row fails at once
        with `FleetGone`, whose message is the last one's `reason`."""
        health, target = self._scheduler.health, self._scheduler.server
        self._on_loop(lambda: health.hold_out(target(server), reason, retired=True))

    def _on_loop(self, apply: Callable[[], None]) -> None:
        """Run `apply` on the loop thread, carry out what it decided and wait for it; a no-op
        once closed."""
        if self._loop is None or self._closed:
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                apply()
            except Exception as err:
                done.set_exception(err)
            else:
                done.set_result(None)
            finally:
                self._carry_out()  # the waiting caller resumes only once this returns

        self._loop.call_soon_threadsafe(run)
        done.result()

    def stats(self) -> DispatchStats:
        """A consistent snapshot of the counters; cheap enough to call every second."""
        return self._counters.snapshot(self._scheduler.servers, self._timeout.seconds)

    # ---- loop thread ------------------------------------------------------------------

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    async def _open(self) -> None:
        servers = len(self._scheduler.servers)
        session = self._make_session(servers * self._slot_cap + servers, self._headers)
        self._sender = Sender(
            session,
            model=self._model,
            api_key=self._api_key,
            sampling=self._sampling,
            regeneration=self._regeneration,
            tuning=self._tuning,
            timeout=self._timeout,
            reprobe=self._reprobe,
        )

    async def _shutdown(self) -> None:
        self._scheduler.abort_all(FleetError("dispatcher closed before the shard finished"))
        self._carry_out()
        for probe in self._probes.values():
            probe.cancel()
        if self._dead_timer is not None:
            self._dead_timer.cancel()
        if self._hedge_timer is not None:
            self._hedge_timer.cancel()
        for side in self._side_tasks:
            side.cancel()
        pending = [*self._probes.values(), *self._side_tasks]
        await asyncio.gather(*pending, return_exceptions=True)
        # Others' tasks on this loop end with it: the fleet's shared (shielded) re-probe
        # outlives the cancel of ours. Bounded: a cancel can be lost (bpo-42130).
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=_ORPHAN_WAIT_S)
        if self._sender is not None:
            await self._sender.session.close()

    def _accept(self, job: ShardJob) -> None:
        fatal = self._scheduler.fatal
        if fatal is not None or self._closed:
            job.abort(fatal or FleetError("dispatcher closed"))
            return
        self._scheduler.accept(job)
        self._carry_out()

    def _decide(self, decide: Callable[..., None], *args: object) -> None:
        """A timer's event: the scheduler's decision, then what it decided."""
        decide(*args)
        self._carry_out()

    def _carry_out(self) -> None:
        """Do what the scheduler decided, in its order: start the requests it launched, cut
        the copies it settled, cancel those it took back (some may have just started), set
        the timers and re-probes it asked for."""
        s, loop = self._scheduler, self._loop
        assert loop is not None and self._sender is not None
        if s.launched:
            for flight in s.launched:
                # The task is named by its rid: an abort names the request by it.
                self._tasks[flight] = loop.create_task(self._attempt(flight), name=flight.rid)
            s.launched.clear()
        if s.cut:
            for flight in s.cut:
                side = loop.create_task(self._sender.abort(flight.server.endpoint, flight.rid))
                self._side_tasks.add(side)
                side.add_done_callback(self._side_tasks.discard)
            s.cut.clear()
        if s.taken:
            for flight in s.taken:
                task = self._tasks.pop(flight, None)
                if task is not None:
                    task.cancel()
            s.taken.clear()
        if s.retries:
            for delay, work in s.retries:
                jittered = delay * self._random.uniform(0.5, 1.5)
                loop.call_later(jittered, self._decide, s.requeue, work)
            s.retries.clear()
        if s.probing:
            for server, probe in s.probing.items():
                running = self._probes.get(server)
                if probe and running is None:
                    self._probes[server] = loop.create_task(self._reprobe_until_healthy(server))
                elif not probe and running is not None:
                    running.cancel()
                    del self._probes[server]
            s.probing.clear()
        if s.down and self._dead_timer is None:
            after = self._generation.fleet_dead_s
            self._dead_timer = loop.call_later(after, self._decide, s.health.fleet_dead, after)
        elif not s.down and self._dead_timer is not None:
            self._dead_timer.cancel()
            self._dead_timer = None
        if s.rearm:
            if self._hedge_timer is not None:
                self._hedge_timer.cancel()
                self._hedge_timer = None
            if s.wake_in is not None:
                self._hedge_timer = loop.call_at(loop.time() + s.wake_in, self._decide, s.pump)
            s.rearm = False

    async def _attempt(self, flight: Flight) -> None:
        assert self._sender is not None
        work = flight.work
        reply = await self._sender.send(flight.server.endpoint, work.job, work.pos, flight.rid)
        self._tasks.pop(flight, None)
        self._scheduler.landed(flight, reply)
        self._carry_out()

    async def _reprobe_until_healthy(self, server: Server) -> None:
        assert self._sender is not None
        t = self._tuning
        delay = t.probe_backoff_s
        while True:
            await asyncio.sleep(delay * self._random.uniform(0.8, 1.2))
            try:
                passed = await self._sender.probe(server.endpoint)
            except FleetUnauthorized as err:
                # Back, but refusing the key (restarted with another one): every request
                # would be refused too, so the run stops rather than re-probe it for ever.
                if not self._closed:
                    self._probes.pop(server, None)
                    self._scheduler.health.die(err)
                    self._carry_out()
                return
            if self._closed:
                # _shutdown cancelled this task, but a cancel that lands as its probe
                # finishes can be lost (Python 3.11's wait_for, bpo-42130): the loop went on
                # re-probing and close() waited for it for ever. The closed flag ends it.
                return
            if passed:
                break
            delay = min(delay * 2, t.probe_backoff_max_s)
        self._probes.pop(server, None)
        self._scheduler.health.readmit(server, "passed its probe and is back in the fleet")
        self._carry_out()
