"""The supervisor: a launched server that exits or hangs is stopped and started again.

regen launched the servers, so it owns their lives for the whole run. A thread of its own
(its own event loop, apart from the dispatcher's) checks each server every second or so:

- Exit: its process ended (a CUDA error, an NCCL watchdog, the OOM killer, kill -9).
- Hang: it owes answers (requests in flight) and has given no sign of life for `hang_s` (no
  request answered, per the dispatcher's `last_answer`; no /health 200; no token generated,
  per its /metrics counter), while another server answered, or, alone, while its /health
  fails. A busy server can answer no request for minutes (long generations) and SGLang's
  /health can answer a false 503 under a long prefill (SGLANG_API.md), but its token counter
  moves; a stopped process or a stuck scheduler gives none of the three. A server not heard
  from for half of `hang_s` gets one liveness probe at a time, never a stack of them
  (sglang#35884). A server the dispatcher took out after failed requests and whose re-probes
  fail for `hang_s` is hung too (sglang#6624: /health 200 while the scheduler is stuck).

Either way its requests go to the others at no attempt's cost (`Pool.hold`), its whole
process group is killed (SIGKILL ends a stopped process too), and after a backoff it is
started again from its recorded command (`Fleet.restart`); it rejoins the dispatcher once the
launch's probes pass (health, model, a real generation). A server that would need more than
`max_restarts` relaunches within `window_s` stays out (`Pool.retire`) with one line saying
why and where its log is; the dispatcher ends the run at once when none is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import aiohttp

from regen.config import RelaunchConfig
from regen.fleet.cause import Cause, exit_text
from regen.fleet.handle import Fleet, Member
from regen.fleet.launch import await_ready
from regen.fleet.metrics import ServerMetrics, parse_metrics
from regen.fleet.process import ServerProcess
from regen.fleet.report import FleetRow, Relaunch

log = logging.getLogger(__name__)

# The dispatcher's states (regen.client.ServerState), which regen.fleet must not import.
HEALTHY, QUARANTINED = "healthy", "quarantined"
_TAIL_LINES = 20
_KILL_WAIT_S = 10.0
_BACKOFF_GROWTH_MAX = 8  # the backoff doubles per relaunch in the window, up to 8x


class ServerView(Protocol):
    """One server as the dispatcher's stats show it (`regen.client.ServerStats`)."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def last_answer(self) -> float | None: ...
    @property
    def quarantine_reason(self) -> str | None: ...


class PoolStats(Protocol):
    @property
    def servers(self) -> Sequence[ServerView]: ...


class Pool(Protocol):
    """What the supervisor asks of the dispatcher (`regen.client.Dispatcher`)."""

    def stats(self) -> PoolStats: ...
    def hold(self, server: str, reason: str) -> None: ...
    def restore(self, server: str) -> None: ...
    def retire(self, server: str, reason: str) -> None: ...


@dataclass
class _Watch:
    """One launched server as the supervisor follows it."""

    member: Member
    heard: float
    """The latest sign of life (monotonic): an answer, a /health 200, tokens generated."""
    relaunches: deque[float] = field(default_factory=deque)
    tokens: float | None = None
    probed: float = float("-inf")
    failed: float | None = None
    """When its last liveness probe that found no sign of life started."""
    said: str = ""
    taken_out: float | None = None
    """Since when the dispatcher has had it out after failed requests."""
    probe: asyncio.Task[None] | None = None
    recovery: asyncio.Task[None] | None = None
    out: bool = False

    @property
    def name(self) -> str:
        return self.member.endpoint.name


class Supervisor:
    """Watches the launched servers of `fleet` for `pool` between `start` and `close`;
    `on_change` sees the fleet report after each relaunch (to write `report/fleet.json`)."""

    def __init__(
        self,
        fleet: Fleet,
        pool: Pool,
        relaunch: RelaunchConfig,
        *,
        startup_timeout_s: float,
        on_change: Callable[[list[FleetRow]], None] = lambda _: None,
    ) -> None:
        self._fleet = fleet
        self._pool = pool
        self._config = relaunch
        self._startup_timeout_s = startup_timeout_s
        self._on_change = on_change
        hang = relaunch.hang_s
        self._poll_s = min(1.0, hang / 10)
        self._probe_s = min(25.0, hang / 2)  # SGLang's /health waits 20 s on its own
        now = time.monotonic()
        self._watches = [_Watch(m, heard=now) for m in fleet.launched]
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> Supervisor:
        """Start watching; an external fleet (nothing launched) needs no thread."""
        if not self._watches or self._thread is not None:
            return self
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="regen-supervisor", daemon=True
        )
        self._thread.start()
        ready.wait()
        return self

    def close(self) -> None:
        """Stop watching; a relaunch under way is cancelled (the fleet's teardown stops what
        it started)."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None or loop is None or stop is None:
            return
        with contextlib.suppress(RuntimeError):  # its loop already ended
            loop.call_soon_threadsafe(stop.set)
        thread.join()
        self._thread = None

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- its own loop -------------------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except Exception:  # the run goes on unsupervised rather than stopping here
            log.exception("supervisor: stopped; servers that exit or hang are not relaunched")
        finally:
            ready.set()  # `start` must not wait on a loop that never came up

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            self._session = session
            ready.set()
            try:
                while not self._stop.is_set():
                    try:
                        self._tick(time.monotonic())
                    except Exception:  # a bug in one check must not end the watch
                        log.exception("supervisor: a check failed; the next one goes on")
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._poll_s):
                            await self._stop.wait()
            finally:
                tasks = [t for w in self._watches for t in (w.probe, w.recovery) if t]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _tick(self, now: float) -> None:
        if self._fleet.closing:
            return  # a server that exits now was stopped by the teardown
        views = {s.name: s for s in self._pool.stats().servers}
        for w in self._watches:
            view = views.get(w.name)
            if w.out or w.recovery is not None or view is None:
                continue
            if view.quarantine_reason is not None:
                w.out = True  # the live audit holds it out for the run: not ours to bring back
                continue
            if view.last_answer is not None:
                w.heard = max(w.heard, view.last_answer)
            cause = self._cause(w, view, views, now)
            if cause is not None:
                w.recovery = asyncio.create_task(self._recover(w, cause))
            elif (
                view.state == HEALTHY
                and w.probe is None
                and now - w.heard >= self._config.hang_s / 2
                and now - w.probed >= self._config.hang_s / 4
            ):
                w.probed = now
                w.probe = asyncio.create_task(self._listen(w, now))

    def _cause(
        self, w: _Watch, view: ServerView, views: dict[str, ServerView], now: float
    ) -> Cause | None:
        """Why `w` must be relaunched now, or None."""
        process = w.member.process
        assert process is not None
        code = process.exit_code()
        if code is not None:
            return Cause(exit_text(code), process.command.log_path, process.log_tail(_TAIL_LINES))
        hang = self._config.hang_s
        if view.state == QUARANTINED:
            w.taken_out = w.taken_out or now
            if now - w.taken_out < hang:
                return None
            return self._hung(
                process, f"no answer for {now - w.taken_out:.0f} s (taken out after failed "
                "requests, its re-probes failing since)",
            )  # fmt: skip
        w.taken_out = None
        silent = now - w.heard
        if view.state != HEALTHY or not view.in_flight or silent < hang:
            return None
        if w.failed is None or w.failed < w.heard:
            return None  # no liveness probe has failed since it was last heard
        serving = [
            o for o in self._watches
            if o is not w and not o.out and (v := views.get(o.name)) is not None
            and v.state == HEALTHY
        ]  # fmt: skip
        if serving and not any(now - o.heard < hang for o in serving):
            return None  # nobody answered: no evidence against this server in particular
        return self._hung(
            process,
            f"no answer for {silent:.0f} s with {view.in_flight} requests in flight ({w.said})",
        )

    @staticmethod
    def _hung(process: ServerProcess, what: str) -> Cause:
        return Cause(f"hung: {what}", process.command.log_path)

    async def _listen(self, w: _Watch, started: float) -> None:
        """One liveness probe: /health, then the token counter of /metrics."""
        try:
            endpoint = w.member.endpoint
            (health, said), (status, text) = await asyncio.gather(
                self._get(endpoint.url_of("/health")), self._get(endpoint.url_of("/metrics"))
            )
            metrics = _metrics(text) if status == 200 else None
            tokens = metrics.generation_tokens if metrics is not None else None
            before, w.tokens = w.tokens, tokens if tokens is not None else w.tokens
            if health == 200 or (tokens is not None and before is not None and tokens > before):
                w.heard = max(w.heard, time.monotonic())
            elif tokens is None or before is not None:  # a first count is no evidence yet
                w.failed, w.said = started, f"/health {said}, no tokens generated"
        finally:
            w.probe = None

    async def _get(self, url: str) -> tuple[int | None, str]:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=self._probe_s)
        try:
            async with self._session.get(url, timeout=timeout) as resp:
                return resp.status, (await resp.text() if resp.status == 200 else f"{resp.status}")
        except TimeoutError:
            return None, f"no answer within {self._probe_s:g} s"
        except (aiohttp.ClientError, OSError) as err:
            return None, type(err).__name__

    # ---- bringing one back ----------------------------------------------------------------

    async def _recover(self, w: _Watch, cause: Cause) -> None:
        try:
            await self._bring_back(w, cause)
        except Exception as err:  # a bug here must not leave a server held for ever
            log.exception("%s: its relaunch failed", w.name)
            await self._give_up(w, Cause(f"its relaunch failed: {err!r}", cause.log_path), cause.at)
        finally:
            w.recovery = None

    async def _bring_back(self, w: _Watch, cause: Cause) -> None:
        """Take it out, kill its group, and start it again until it passes its probes or its
        relaunches run out."""
        down_since = cause.at
        told: Cause | None = None
        await asyncio.to_thread(self._pool.hold, w.name, f"to be relaunched: {cause.what}")
        while True:
            process = w.member.process
            assert process is not None
            await asyncio.to_thread(_kill, process)
            now = time.monotonic()
            while w.relaunches and now - w.relaunches[0] > self._config.window_s:
                w.relaunches.popleft()
            if len(w.relaunches) >= self._config.max_restarts:
                await self._give_up(w, cause, down_since)
                return
            done = len(w.relaunches)
            delay = self._config.backoff_s * min(2**done, _BACKOFF_GROWTH_MAX)
            c = self._config
            then = f"relaunching it in {delay:g} s ({done + 1} of at most {c.max_restarts} in "
            if told is not None and cause.same_as(told):
                # One line per cause: a relaunch that failed as the one before (a port held, a
                # GPU still full) says nothing new; the fleet report keeps each one.
                log.info("%s relaunch failed the same way; %s%g s)", w.name, then, c.window_s)
            else:
                log.warning("%s %s", w.name, cause.log_line(f"{then}{c.window_s:g} s)"))
            told = cause
            relaunch = Relaunch(
                cause=cause.line(), log=str(cause.log_path), log_tail=cause.tail,
                down_at=cause.at,
            )  # fmt: skip
            self._update(
                w, status="relaunching", relaunch_log=(*self._row(w).relaunch_log, relaunch)
            )
            await asyncio.sleep(delay)
            w.relaunches.append(time.monotonic())
            try:
                started = await asyncio.to_thread(self._fleet.restart, w.member)
            except OSError as err:  # the interpreter is gone, the disk is full
                cause = Cause(f"could not start: {err}", process.command.log_path)
                continue
            if started is None:
                log.info("%s not relaunched: the fleet is being torn down", w.name)
                return
            cause_or_none = await self._ready(w, started)
            if cause_or_none is None:
                return
            cause = cause_or_none

    async def _ready(self, w: _Watch, process: ServerProcess) -> Cause | None:
        """Wait for the relaunched server's probes; None once it is back in the dispatcher."""
        assert self._session is not None
        row = await await_ready(
            self._session, w.member.endpoint, self._fleet.target, self._fleet.settings,
            self._startup_timeout_s, process,
        )  # fmt: skip
        if row.status != "healthy":
            code = process.exit_code()
            what = exit_text(code) if code is not None else row.reason.splitlines()[0]
            tail = process.log_tail(_TAIL_LINES)
            return Cause(f"relaunch failed: {what}", process.command.log_path, tail)
        # Read at argument parsing: a ready server no longer needs its key on disk.
        process.command.key_file.unlink(missing_ok=True)
        await asyncio.to_thread(process.record_cmdline)
        w.heard, w.failed, w.tokens, w.taken_out = time.monotonic(), None, None, None
        await asyncio.to_thread(self._pool.restore, w.name)
        *before, last = self._row(w).relaunch_log
        back = last.model_copy(update={"back_at": time.time()})
        self._update(
            w, status="healthy", reason="", startup_s=row.startup_s,
            relaunch_log=(*before, back),
        )  # fmt: skip
        log.warning(
            "%s is back after relaunch %d: ready in %.1f s, pid %d",
            w.name, self._row(w).relaunches, row.startup_s or 0.0, process.pid,
        )  # fmt: skip
        return None

    async def _give_up(self, w: _Watch, cause: Cause, down_since: float) -> None:
        w.out = True
        reason = cause.out_line(down_since, len(w.relaunches))
        log.error("%s stays out for the rest of the run: %s", w.name, reason)
        self._update(w, status="out", reason=reason)
        await asyncio.to_thread(self._pool.retire, w.name, reason)

    def _row(self, w: _Watch) -> FleetRow:
        return next(r for r in self._fleet.report if r.server == w.name)

    def _update(self, w: _Watch, **fields: Any) -> None:
        self._fleet.update_report([self._row(w).model_copy(update=fields)])
        try:
            self._on_change(self._fleet.report)
        except Exception as err:  # a report not written must not stop a relaunch
            log.warning("could not write the fleet report: %s", err)


def _kill(process: ServerProcess) -> None:
    """SIGKILL its whole group (a dead or hung server has no graceful path, and its children
    may hold the GPU) and wait for it; its PID and key files go with it."""
    process.kill()
    if not process.wait_gone(time.monotonic() + _KILL_WAIT_S):
        log.error("%s (pid %d) survived SIGKILL", process.command.name, process.pid)
    process.remove_files()


def _metrics(text: str) -> ServerMetrics | None:
    """The figures of a /metrics answer; None when it is not Prometheus text."""
    try:
        return parse_metrics(text)
    except ValueError:
        return None
