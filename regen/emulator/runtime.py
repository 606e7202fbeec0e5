"""The emulated engine at run time: the scheduler that paces decoding, and the faults that
fire over a server's life (a hang, a crash, transient 500s, answers cut short).

The output faults (empty answers, leaked think tags...) belong to the model's plan; these
are the ones that depend on what the server has served so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random

from regen.emulator.args import EmuArgs
from regen.emulator.capacity import Slots
from regen.emulator.faults import Faults
from regen.emulator.model import EmulatedModel, Generation, Plan
from regen.emulator.prefix_cache import PrefixCache
from regen.emulator.wire import RequestError

log = logging.getLogger("regen.emulator")


class QueuedAbort(Exception):
    """The request was aborted before it got a slot: 0.5.23 answers it at once, with nothing
    decoded (tokenizer_manager `_handle_abort_req`, wire.queued_abort)."""


class Scheduler:
    """Slots, prefill and decode time, the prefix cache and aborts: a request holds a slot for
    its prefill (the uncached part of its prompt, one prefill at a time per server, as SGLang
    prefills between decode steps) and then one sleep of its decode."""

    def __init__(self, args: EmuArgs, model: EmulatedModel, context_length: int) -> None:
        self.model = model
        self.slots = Slots(args.max_running_requests)
        self.max_queued = args.max_queued_requests
        self.context_length = context_length
        self.accept_length = args.accept_length
        # Per-request decode speed in simulated tokens/s, and wall seconds per token.
        self.speed = args.tokens_per_s * args.faults.slow
        self.wall_per_token = args.time_scale / self.speed
        # The server's prefill rate (a slow GPU prefills slowly too), wall seconds per token.
        self.wall_per_prefill_token = args.time_scale / (
            args.prefill_tokens_per_s * args.faults.slow
        )
        self._prefill = asyncio.Lock()
        capacity = args.server_args.get("max_total_tokens") or (
            args.max_running_requests * context_length
        )
        self.cache = None if args.server_args.get("disable_radix_cache") else PrefixCache(capacity)
        self.last_gen_throughput = 0.0
        self.tokens_in_use = 0
        self.activity = False
        self.cache_hit_rate = 0.0  # the last prefill's, as sglang:cache_hit_rate
        self._aborts: dict[str, asyncio.Future[bool]] = {}

    @property
    def token_usage(self) -> float:
        """The KV cache's share in use, as SGLang's `token usage` reports it."""
        return self.tokens_in_use / (self.slots.limit * self.context_length)

    def in_flight(self, rid: str) -> bool:
        return rid in self._aborts

    def abort(self, rid: str | None) -> int:
        """Cut requests short (None: every one), as /abort_request does in 0.5.23: the
        tokenizer manager passes an abort on only for a rid it has in flight (an empty or
        unknown rid does nothing), and the scheduler then cuts every request whose rid *starts
        with* it (scheduler.py abort_request). Returns how many it cut."""
        if rid is not None and rid not in self._aborts:
            return 0
        rids = [r for r in self._aborts if rid is None or r.startswith(rid)]
        cut = 0
        for each in rids:
            future = self._aborts.get(each)
            if future is not None and not future.done():
                future.set_result(True)
                cut += 1
        return cut

    async def run(
        self,
        rid: str,
        plan: Plan,
        budget: int,
        prompt_ids: list[int],
        thinking: bool,
        cut_at: float | None = None,
    ) -> tuple[Generation, int]:
        """Queue for a slot, prefill what the cache lacks, then sleep the decode time once; an
        abort cuts it short (finish_reason abort), and `cut_at` is the share of the decode after
        which the server aborts it itself (the abort fault). Returns the output and the
        prompt's cached tokens; raises QueuedAbort for an abort before it had a slot."""
        out = self.model.generate(plan, budget=budget, thinking=thinking)
        prompt = len(prompt_ids)
        full = self.slots.running >= self.slots.limit
        if self.max_queued is not None and full and self.slots.queued >= self.max_queued:
            raise RequestError("The request queue is full.", 503, "ServiceUnavailableError")
        loop = asyncio.get_running_loop()
        aborted: asyncio.Future[bool] = loop.create_future()
        self._aborts[rid] = aborted
        cached = 0
        try:
            await self._acquire(aborted)
            self.activity = True
            held = prompt + out.completion_tokens  # out is replaced when cut: give back this
            self.tokens_in_use += held
            self._note_throughput()
            try:
                if not aborted.done():
                    cached = await self._prefill_once(prompt_ids, aborted)
                started = loop.time()
                seconds = out.completion_tokens * self.wall_per_token
                timers = [loop.call_later(seconds, _settle, aborted, False)]
                if cut_at is not None:
                    timers.append(loop.call_later(seconds * cut_at, _settle, aborted, True))
                try:
                    if await aborted:
                        done = int((loop.time() - started) / self.wall_per_token)
                        cut = self.model.generate(plan, budget=min(done, budget), thinking=thinking)
                        out = dataclasses.replace(cut, finish_reason="abort")
                finally:
                    for timer in timers:
                        timer.cancel()
                if self.cache is not None:
                    self.cache.insert(prompt_ids + out.token_ids)
            finally:
                self.tokens_in_use -= held
                self.slots.release()
                self._note_throughput()
        finally:
            self._aborts.pop(rid, None)
        return out, cached

    async def _acquire(self, aborted: asyncio.Future[bool]) -> None:
        """A slot, unless an abort comes first: the scheduler drops a queued request from its
        waiting queue at once (scheduler.py abort_request) and it never runs."""
        acquire: asyncio.Future[None] = asyncio.ensure_future(self.slots.acquire())
        try:
            await asyncio.wait((acquire, aborted), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the handler's own cancel: no slot may stay taken
            if acquire.done():
                self.slots.release()
            acquire.cancel()
            raise
        if acquire.done():
            return
        acquire.cancel()  # Slots.acquire gives back a slot handed over as it is cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await acquire
        raise QueuedAbort

    async def _prefill_once(self, prompt_ids: list[int], aborted: asyncio.Future[bool]) -> int:
        """Match the cache, then compute the rest, one prefill at a time per server; the
        prompt is in the cache from then on (SGLang inserts it once prefilled)."""
        async with self._prefill:
            cached = self.cache.match(prompt_ids) if self.cache is not None else 0
            prompt = len(prompt_ids)
            self.cache_hit_rate = cached / prompt if prompt else 0.0
            seconds = (prompt - cached) * self.wall_per_prefill_token
            if seconds > 0 and not aborted.done():
                await asyncio.wait([aborted], timeout=seconds)
            if self.cache is not None:
                self.cache.insert(prompt_ids)
        return cached

    def _note_throughput(self) -> None:
        # The decode rate the running batch gives, in simulated tokens/s; kept when idle,
        # like SGLang's "last" gen throughput.
        if self.slots.running:
            self.last_gen_throughput = self.slots.running * self.speed

    async def report_loop(self) -> None:
        """SGLang-like 'Decode batch' lines, so a server log shows load as a real one does."""
        while True:
            await asyncio.sleep(5.0)
            if self.activity or self.slots.running:
                self.activity = False
                log.info(
                    "Decode batch, #running-req: %d, #queue-req: %d, token usage: %.2f, "
                    "accept len: %.2f, gen throughput (token/s): %.2f",
                    self.slots.running,
                    self.slots.queued,
                    self.token_usage,
                    self.accept_length,
                    self.last_gen_throughput,
                )


class FaultRuntime:
    """The faults that count what was served: hang after N chats, crash after N answers,
    a drawn fraction of 500s. One per server, so two servers never share a count."""

    def __init__(self, faults: Faults, seed: int) -> None:
        self.faults = faults
        self._http500 = random.Random(f"http500:{seed}")
        self._abort = random.Random(f"abort:{seed}")
        self._arrivals = 0
        self._completed = 0
        self._crashing = False
        self._rotated = False

    @property
    def hung(self) -> bool:
        hang = self.faults.hang_after
        return hang is not None and self._arrivals > hang

    async def arrive(self) -> None:
        """Count a chat request; past hang-after=N it is never answered (sglang#6624)."""
        arrival = self._arrivals
        self._arrivals += 1
        hang = self.faults.hang_after
        if hang is not None and arrival >= hang:
            await asyncio.get_running_loop().create_future()

    @property
    def key_rotated(self) -> bool:
        """unauthorized-after=N: past N chats the server refuses the key it started with."""
        after = self.faults.unauthorized_after
        rotated = after is not None and self._arrivals >= after
        if rotated and not self._rotated:
            self._rotated = True
            log.warning("API key changed (emulated fault unauthorized-after): 401 from now on")
        return rotated

    @property
    def output_faults_on(self) -> bool:
        """faults-after=N: the output faults hit only chats after the first N (probes count)."""
        after = self.faults.faults_after
        return after is None or self._arrivals > after

    def http500(self) -> bool:
        """Whether this request draws the transient 500 (`http500=FRACTION`)."""
        fraction = self.faults.fractions.get("http500", 0.0)
        return bool(fraction) and self._http500.random() < fraction

    def abort_at(self) -> float | None:
        """`abort=FRACTION`: whether this request is cut short by the server, and after what
        share of its decode (None: it runs to its end)."""
        fraction = self.faults.fractions.get("abort", 0.0)
        if not fraction or self._abort.random() >= fraction:
            return None
        return self._abort.random()

    async def before_answer(self) -> None:
        """crash-after=N: the (N+1)th answer is never sent; the process is going down."""
        crash = self.faults.crash_after
        if crash is not None and (self._crashing or self._completed >= crash):
            self._crash()
            await asyncio.get_running_loop().create_future()
        self._completed += 1

    def after_answer(self) -> None:
        crash = self.faults.crash_after
        if crash is not None and self._completed >= crash:
            self._crash()

    def _crash(self) -> None:
        if not self._crashing:
            self._crashing = True
            log.error("Scheduler hit an exception (emulated fault crash-after); exiting.")
            # A moment for the answer just written to leave the socket buffer.
            asyncio.get_running_loop().call_later(0.05, os._exit, 1)


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
