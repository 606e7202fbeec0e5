"""The emulated engine at run time: the scheduler that paces decoding, and the faults that
fire over a server's life (a hang, a crash, transient 500s, answers cut short).

The output faults (empty answers, leaked think tags...) belong to the model's plan; these
are the ones that depend on what the server has served so far.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random

from regen.emulator.args import EmuArgs
from regen.emulator.batch import Batch, Job
from regen.emulator.faults import Faults
from regen.emulator.gpu import DEFAULT_CHUNKED_PREFILL, BatchCurve
from regen.emulator.model import EmulatedModel, Generation, Plan
from regen.emulator.prefix_cache import PrefixCache
from regen.emulator.wire import RequestError

log = logging.getLogger("regen.emulator")


class QueuedAbort(Exception):
    """The request was aborted before it got a slot: 0.5.23 answers it at once, with nothing
    decoded (tokenizer_manager `_handle_abort_req`, wire.queued_abort)."""


class Scheduler:
    """One server's requests on its emulated GPU (`regen.emulator.batch`): admission against
    the KV pool, prefill, a decode step that slows as the batch grows, retraction, the
    prefix cache and aborts."""

    def __init__(self, args: EmuArgs, model: EmulatedModel, context_length: int) -> None:
        self.model = model
        self.max_queued = args.max_queued_requests
        self.context_length = context_length
        self.accept_length = args.accept_length
        # A slow GPU (the slow fault) decodes and prefills slowly alike.
        curve = BatchCurve(args.tokens_per_s * args.faults.slow, args.batch_knee)
        self.kv_tokens = args.kv_tokens()
        self.max_running = args.effective_max_running(context_length)
        cache = None if args.server_args.get("disable_radix_cache") else PrefixCache(self.kv_tokens)
        self.batch = Batch(
            curve,
            kv_tokens=self.kv_tokens,
            max_running=self.max_running,
            time_scale=args.time_scale,
            prefill_tokens_per_s=args.prefill_tokens_per_s * args.faults.slow,
            chunk_tokens=args.server_args.get("chunked_prefill_size") or DEFAULT_CHUNKED_PREFILL,
            cache=cache,
        )
        self.cache = cache
        self.wall_per_token = self.batch.wall_step_s(1)
        self.activity = False
        self._jobs: dict[str, Job] = {}

    @property
    def token_usage(self) -> float:
        """The KV pool's share in use, as SGLang's `token usage` reports it."""
        return self.batch.token_usage

    @property
    def tokens_in_use(self) -> int:
        return round(self.batch.kv_used)

    @property
    def last_gen_throughput(self) -> float:
        return self.batch.gen_throughput

    @property
    def cache_hit_rate(self) -> float:
        """The last prefill's, as sglang:cache_hit_rate."""
        return self.batch.cache_hit_rate

    def in_flight(self, rid: str) -> bool:
        return rid in self._jobs

    def abort(self, rid: str | None) -> int:
        """Cut requests short (None: every one), as /abort_request does in 0.5.23: the
        tokenizer manager passes an abort on only for a rid it has in flight (an empty or
        unknown rid does nothing), and the scheduler then cuts every request whose rid *starts
        with* it (scheduler.py abort_request). Returns how many it cut."""
        if rid is not None and rid not in self._jobs:
            return 0
        jobs = [job for r, job in self._jobs.items() if rid is None or r.startswith(rid)]
        return sum(self.batch.cut(job) for job in jobs)

    async def run(
        self,
        rid: str,
        plan: Plan,
        budget: int,
        prompt_ids: list[int],
        thinking: bool,
        cut_at: float | None = None,
    ) -> tuple[Generation, int]:
        """Queue, prefill what the cache lacks, decode in the batch; an abort cuts it short
        (finish_reason abort), and `cut_at` is the share of the decode after which the server
        aborts it itself (the abort fault). Returns the output and the prompt's cached tokens;
        raises QueuedAbort for an abort before it was admitted."""
        out = self.model.generate(plan, budget=budget, thinking=thinking)
        batch = self.batch
        full = batch.running >= batch.limit
        if self.max_queued is not None and full and batch.queued >= self.max_queued:
            raise RequestError("The request queue is full.", 503, "ServiceUnavailableError")
        loop = asyncio.get_running_loop()
        n = out.completion_tokens
        job = Job(
            prompt_ids,
            n,
            budget,
            loop.create_future(),
            cut_at=None if cut_at is None else int(n * cut_at),
        )
        self._jobs[rid] = job
        self.activity = True
        try:
            batch.submit(job)
            try:
                ended = await job.ended
            except asyncio.CancelledError:  # the handler's own cancel: give the slot back
                batch.cut(job)
                raise
        finally:
            self._jobs.pop(rid, None)
        if ended.queued:
            raise QueuedAbort
        if ended.cut:
            cut = self.model.generate(plan, budget=min(ended.decoded, budget), thinking=thinking)
            out = dataclasses.replace(cut, finish_reason="abort")
        if self.cache is not None:
            self.cache.insert(prompt_ids + out.token_ids)
        return out, job.cached

    async def report_loop(self) -> None:
        """SGLang-like 'Decode batch' lines, so a server log shows load as a real one does."""
        batch = self.batch
        while True:
            await asyncio.sleep(5.0)
            if self.activity or batch.running:
                self.activity = False
                log.info(
                    "Decode batch, #running-req: %d, #token: %d, token usage: %.2f, "
                    "accept len: %.2f, gen throughput (token/s): %.2f, #queue-req: %d",
                    batch.running,
                    self.tokens_in_use,
                    self.token_usage,
                    self.accept_length,
                    self.last_gen_throughput,
                    batch.queued,
                )

    def close(self) -> None:
        self.batch.close()


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
