"""The server's running batch as SGLang 0.5.23 schedules it, on a simulated decode clock.

A request waits (FIFO) until the scheduler admits it: a free running slot, and room in the KV
pool for its prompt plus the share of its remaining `max_tokens` SGLang expects it to use
(`new_token_ratio`, 0.7 decaying to 0.098 over 600 steps). Admitted requests are prefilled
together, up to --chunked-prefill-size tokens, and decoding stops meanwhile (SGLang runs a
prefill batch between decode steps; in the linear model, without a knee, they go on as the
emulator always let them). Then every running request gains one token per decode
step, and a step takes `BatchCurve.step_s(batch)`. When the running requests' KV outgrows the
pool, the youngest are retracted (their KV freed, sent back to the queue to be prefilled again
with what they had decoded) and the ratio is raised, as `retract_decode` does.

No per-token work: every running request advances on one shared step counter `steps`, a
request finishes when the counter reaches its target, and the loop sleeps until the next
finish, retraction or prefill end. An event costs O(log n), a scheduling pass O(batch), so a
server with thousands of requests in flight costs next to no CPU.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field

from regen.emulator.gpu import (
    CLIP_MAX_NEW_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY,
    RETRACT_DECODE_STEPS,
    BatchCurve,
)
from regen.emulator.prefix_cache import PrefixCache

log = logging.getLogger("regen.emulator")
_STEP_SLACK = 1e-3  # a timer may fire a hair early: a thousandth of a token is "reached"


@dataclass(frozen=True, slots=True)
class Ended:
    """How a request left the batch: tokens decoded, and whether it was cut (an abort) or
    never admitted at all (`queued`: aborted while it waited)."""

    decoded: int
    cut: bool = False
    queued: bool = False


@dataclass(eq=False)
class Job:
    """One request in the batch. `output_len` is the answer it will decode (the emulated
    model knows it up front), `max_new` its budget, which admission reserves against."""

    prompt_ids: list[int]
    output_len: int
    max_new: int
    ended: asyncio.Future[Ended]
    cut_at: int | None = None  # decoded tokens after which the server aborts it itself
    cached: int = 0  # prompt tokens found in the prefix cache at its first prefill
    decoded_before: int = 0  # tokens decoded before a retraction
    admitted_at: float = 0.0  # the step counter when it joined the running batch
    state: str = "waiting"  # waiting | prefill | running | done
    _seq: int = field(default=0)

    @property
    def prompt(self) -> int:
        return len(self.prompt_ids)

    def target(self) -> float:
        """The step count at which it ends: its answer's end, or the server's own cut."""
        end = self.output_len
        if self.cut_at is not None:
            end = min(end, max(self.cut_at, self.decoded_before))
        return self.admitted_at + end - self.decoded_before


class Batch:
    """The running batch and the waiting queue of one server, on the event loop's clock."""

    def __init__(
        self,
        curve: BatchCurve,
        *,
        kv_tokens: int,
        max_running: int,
        time_scale: float,
        prefill_tokens_per_s: float,
        chunk_tokens: int,
        cache: PrefixCache | None,
    ) -> None:
        self.curve = curve
        self.kv_tokens = kv_tokens
        self.limit = max_running
        self.time_scale = time_scale
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.chunk_tokens = chunk_tokens
        self.cache = cache
        self.waiting: deque[Job] = deque()
        self.prefilling: list[Job] = []
        self._running: set[Job] = set()
        self._finishes: list[tuple[float, int, Job]] = []  # (target, seq, job), lazy deletes
        self._seq = itertools.count()
        self.steps = 0.0  # decode steps since start: every running request's shared clock
        self._last = 0.0  # loop time the step counter was last brought up to
        self._prefill_end: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, from the first request
        # sum over running of (prompt + decoded_before - admitted_at): KV used = it + b * steps
        self._kv_base = 0.0
        self._ratio = INIT_NEW_TOKEN_RATIO
        self._ratio_at = 0.0  # step count when the ratio was last set
        # Counters and gauges for /metrics, in simulated tokens.
        self.decode_tokens = 0.0
        self.prefill_tokens = 0
        self.prefill_cache_tokens = 0
        self.retracted_total = 0
        self.retracted_last = 0
        self.cache_hit_rate = 0.0
        self.gen_throughput = 0.0

    # -- what /metrics and /server_info read ---------------------------------------------

    @property
    def running(self) -> int:
        """Requests holding a running slot: decoding or being prefilled."""
        return len(self._running) + len(self.prefilling)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    @property
    def kv_used(self) -> float:
        """KV tokens the running and prefilling requests hold now (read-only: safe from a
        test's thread)."""
        steps = self._steps_at(self._now())
        prefill = sum(j.prompt + j.decoded_before for j in self.prefilling)
        return self._kv_base + len(self._running) * steps + prefill

    @property
    def decoded_now(self) -> float:
        """Tokens decoded since start, up to this instant (read-only, like kv_used): the
        counter is otherwise brought up to date only at the batch's own events."""
        return self.decode_tokens + len(self._running) * (self._steps_at(self._now()) - self.steps)

    @property
    def token_usage(self) -> float:
        return min(1.0, self.kv_used / self.kv_tokens)

    @property
    def new_token_ratio(self) -> float:
        decayed = self._ratio - NEW_TOKEN_RATIO_DECAY * (self.steps - self._ratio_at)
        return max(MIN_NEW_TOKEN_RATIO, decayed)

    def wall_step_s(self, batch: int) -> float:
        return self.curve.step_s(batch) * self.time_scale

    # -- requests in and out ---------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._last = self._loop.time()
        self._advance()
        job._seq = next(self._seq)
        self.waiting.append(job)
        self._schedule()

    def cut(self, job: Job) -> bool:
        """An abort: a waiting request leaves unserved, a running one with what it decoded, a
        prefilling one when its prefill ends. False when it had already ended."""
        if job.ended.done() or job.state == "done":
            return False
        self._advance()
        if job.state == "waiting":
            self.waiting.remove(job)
            # A retracted request answers with what it had decoded; a new one, with nothing.
            self._end(job, Ended(job.decoded_before, cut=True, queued=job.decoded_before == 0))
        elif job.state == "prefill":
            job.cut_at = job.decoded_before  # ends as soon as its prefill does
        else:
            self._leave(job)
            self._end(job, Ended(min(self._decoded(job), job.output_len), cut=True))
        self._schedule()
        return True

    def _decoded(self, job: Job) -> int:
        return job.decoded_before + int(self.steps - job.admitted_at + 1e-9)

    def _end(self, job: Job, ended: Ended) -> None:
        job.state = "done"
        if not job.ended.done():
            job.ended.set_result(ended)

    def _leave(self, job: Job) -> None:
        """Take a running request out of the batch (its heap entry is dropped lazily)."""
        self._running.discard(job)
        self._kv_base -= job.prompt + job.decoded_before - job.admitted_at

    # -- the clock -----------------------------------------------------------------------------

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else self._last

    def _steps_at(self, now: float) -> float:
        """The step counter at loop time `now`: frozen while a prefill runs, except in the
        linear model (no knee), where a prefill never held up the others' decoding."""
        elapsed = now - self._last
        frozen = self._prefill_end is not None and self.curve.knee is not None
        if frozen or not self._running or elapsed <= 0:
            return self.steps
        return self.steps + elapsed / self.wall_step_s(len(self._running))

    def _advance(self, to: float | None = None) -> None:
        """Bring the step counter and the decode counter up to now (or to loop time `to`)."""
        now = self._now() if to is None else to
        steps = self._steps_at(now)
        self.decode_tokens += len(self._running) * (steps - self.steps)
        self.steps, self._last = steps, max(self._last, now)

    def _tick(self) -> None:
        self._timer = None
        end = self._prefill_end
        if end is not None and self._now() >= end - 1e-6:
            # A timer that fires late (a loaded machine) must not stretch the prefill: the
            # batch decodes again from the prefill's own end, with its new requests.
            self._advance(min(end, self._now()))
            self._prefill_done()
        self._advance()
        self._finish_due()
        self._retract_if_full()
        self._schedule()

    def _live(self, entry: tuple[float, int, Job]) -> bool:
        """A heap entry still stands for its job's current run (not ended, not retracted)."""
        return entry[2] in self._running and entry[1] == entry[2]._seq

    def _finish_due(self) -> None:
        while self._finishes:
            entry = self._finishes[0]
            if not self._live(entry):
                heapq.heappop(self._finishes)
                continue
            if entry[0] > self.steps + _STEP_SLACK:
                return
            heapq.heappop(self._finishes)
            job = entry[2]
            # Reached late (a busy loop): the steps past its end were never decoded.
            self.decode_tokens -= max(0.0, self.steps - entry[0])
            self._leave(job)
            end = round(job.target() - job.admitted_at) + job.decoded_before
            self._end(job, Ended(end, cut=end < job.output_len))

    def _retract_if_full(self) -> None:
        """The next step does not fit: retract the youngest (fewest decoded, then longest
        prompt) until it does, keeping at least one, as `retract_decode` does."""
        b = len(self._running)
        if not b or self._kv_base + b * self.steps + b <= self.kv_tokens:
            return
        order = sorted(self._running, key=lambda j: (self._decoded(j), -j.prompt), reverse=True)
        out: list[Job] = []
        while len(order) > 1 and (
            not out or self._kv_base + len(self._running) * (self.steps + 1) > self.kv_tokens
        ):
            job = order.pop()
            decoded = self._decoded(job)
            self._leave(job)
            out.append(job)
            job.decoded_before, job.state = decoded, "waiting"
        self.waiting.extendleft(reversed(out))  # they arrived first: they go first again
        self.retracted_total += len(out)
        self.retracted_last = len(out)
        left = list(self._running)
        old = self.new_token_ratio
        decoded = sum(self._decoded(j) for j in left)
        budget = sum(j.max_new for j in left)
        self._set_ratio(min(1.0, (decoded + RETRACT_DECODE_STEPS * len(left)) / (budget + 1)))
        log.warning(
            "KV cache pool is full. Retract requests. #retracted_reqs: %d, "
            "#new_token_ratio: %.4f -> %.4f",
            len(out), old, self._ratio,
        )  # fmt: skip

    def _set_ratio(self, value: float) -> None:
        self._ratio, self._ratio_at = value, self.steps

    # -- admission and prefill --------------------------------------------------------------

    def _schedule(self) -> None:
        """Admit what fits into one prefill batch (none while one runs), then arm the timer."""
        if self._prefill_end is None and self.waiting:
            self._admit()
        if not self.waiting and not self._running and not self.prefilling:
            self._set_ratio(INIT_NEW_TOKEN_RATIO)  # an idle scheduler resets it
        self._arm()

    def _admit(self) -> None:
        ratio = self.new_token_ratio
        used = self._kv_base + len(self._running) * self.steps
        reserved = sum(
            min(j.max_new - self._decoded(j), CLIP_MAX_NEW_TOKENS) * ratio for j in self._running
        )
        room = self.kv_tokens - used - reserved
        chunk = self.chunk_tokens
        compute = 0
        while self.waiting and self.running < self.limit:
            job = self.waiting[0]
            extend = job.prompt + job.decoded_before  # a retracted request recomputes all
            need = extend + min(job.max_new - job.decoded_before, CLIP_MAX_NEW_TOKENS) * ratio
            alone = not self._running and not self.prefilling
            # A prompt over the chunk size is prefilled alone (SGLang chunks it meanwhile).
            if extend > chunk and chunk < self.chunk_tokens:
                break
            if not alone and (need > room or used + extend > self.kv_tokens):
                break
            self.waiting.popleft()
            if self.cache is not None and not job.decoded_before:
                job.cached = self.cache.match(job.prompt_ids)
                self.cache_hit_rate = job.cached / job.prompt if job.prompt else 0.0
            new = extend - (job.cached if not job.decoded_before else 0)
            compute += new
            self.prefill_tokens += new
            self.prefill_cache_tokens += extend - new
            room -= need
            used += extend
            chunk -= extend
            job.state = "prefill"
            self.prefilling.append(job)
        if self.prefilling:
            seconds = compute / self.prefill_tokens_per_s * self.time_scale
            self._prefill_end = self._now() + seconds

    def _prefill_done(self) -> None:
        self._prefill_end = None
        for job in self.prefilling:
            if self.cache is not None and not job.decoded_before:
                self.cache.insert(job.prompt_ids)  # SGLang holds a prompt once prefilled
            job.state, job.admitted_at, job._seq = "running", self.steps, next(self._seq)
            self._running.add(job)
            self._kv_base += job.prompt + job.decoded_before - job.admitted_at
            heapq.heappush(self._finishes, (job.target(), job._seq, job))
        self.prefilling = []
        self._finish_due()  # an empty answer, or one cut while it prefilled

    def _arm(self) -> None:
        """Sleep until the next event: a prefill's end, a finish, or a full KV pool."""
        loop = self._loop
        if loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        b = len(self._running)
        if b:
            self.gen_throughput = self.curve.throughput(b)  # kept when idle, as SGLang's
        if self._prefill_end is not None:
            self._timer = loop.call_at(self._prefill_end, self._tick)
            return
        if not b:
            return
        while self._finishes and not self._live(self._finishes[0]):
            heapq.heappop(self._finishes)
        nearest = self.steps + self._kv_room_steps()
        if self._finishes:
            nearest = min(nearest, self._finishes[0][0])
        wait = max(0.0, nearest - self.steps) * self.wall_step_s(b)
        self._timer = loop.call_at(self._last + wait, self._tick)

    def _kv_room_steps(self) -> float:
        """Decode steps until the running requests fill the pool (never for a lone request,
        which is never retracted)."""
        b = len(self._running)
        if b < 2:
            return float("inf")
        return max(0.0, (self.kv_tokens - self._kv_base - b * self.steps) / b - 1)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
