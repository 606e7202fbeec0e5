"""How many requests to keep in flight on one server, found by measuring it: no I/O here.

Why a controller on the run's own rows, not a sweep before the run: the best number depends on
the answers' lengths (the KV each request holds, how long it holds a slot), which only the
run's rows have; a sweep on synthetic prompts measures another workload, and each of its
levels costs GPU minutes, since a level's steady state takes several request lifetimes. The
controller spends nothing on measuring: every measurement is of rows being generated. And a
run lasts days: conversations grow, answers lengthen, a server is restarted; it keeps
checking.

What it measures: the server's decode rate (tokens/s from its own counter, which counts at
every decode step, so it answers within seconds of a change) while the client keeps every slot
of the server busy with rows waiting; a tick where the slots were not full (the tail, a shard
border) says nothing about the level and is skipped. The rule, per tick:

- pressure: the server retracted more than `retract_share` of the requests it answered (its
  KV pool ran out: work thrown away): back off to the level this climb came from (or one
  step), and do not climb back until the next re-probe. Its own queue held more than
  `queue_share` of the slots two ticks running (it runs fewer than it is sent: KV or its
  running cap): no higher, and down by what stayed queued, once until the next re-probe;
- climbing: raise by `step` while each raise lifted the rate by `min_gain` and the KV pool has
  room (`kv_headroom`); the first raise that did not pay for itself is undone, and the climb
  ends there;
- settled: every `reprobe_every` measured ticks, try one step up again; keep it if it gains.

After every change the next tick is skipped (the batch refills and prefills at the new level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class TunerSettings(BaseModel):
    """The tuner's knobs; defaults suit a GPU (decode steps of tens of ms)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_s: float = Field(
        default=10.0, gt=0, description="Seconds between measurements of every server."
    )
    step: float = Field(default=1.5, gt=1, description="Factor of one raise (or back-off).")
    min_gain: float = Field(
        default=0.03,
        ge=0,
        description="The share a raise must lift a server's decode rate by to be kept.",
    )
    kv_headroom: float = Field(
        default=0.9, gt=0, le=1, description="KV pool usage past which no raise is tried."
    )
    queue_share: float = Field(
        default=0.05,
        ge=0,
        description="A server queue above this share of its slots means it holds too many.",
    )
    retract_share: float = Field(
        default=0.05,
        ge=0,
        description="Retracted requests, as a share of those the server answered in the "
        "interval, past which it holds too many.",
    )
    reprobe_every: int = Field(
        default=30, ge=1, description="Measured ticks at a settled level between re-probes."
    )
    max_concurrency: int = Field(
        default=1024,
        ge=1,
        description="The most kept in flight on one server, whatever its own cap (SGLang sizes "
        "2,048 to 4,096 from its KV pool): past that many, the rows to keep it busy outgrow "
        "the shards a run holds open.",
    )


class Phase(StrEnum):
    CLIMBING = "climbing"
    SETTLED = "settled"
    PROBING = "probing"


@dataclass(frozen=True, slots=True)
class Sample:
    """One server over one interval."""

    rate: float | None
    """Tokens/s the server decoded (its realtime counter), else delivered to the client."""
    saturated: bool
    """The client kept every slot busy and had rows waiting: the level was exercised."""
    queued: float | None = None
    """The server's own waiting queue (sglang:num_queue_reqs)."""
    token_usage: float | None = None
    retracted: float = 0.0
    """Requests the server retracted during the interval."""
    completed: float = 0.0
    """Requests of this server the client got answers to during the interval."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What one tick decided: the new level and why (for the log and the live card)."""

    limit: int
    previous: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.limit != self.previous


class Controller:
    """One server's concurrency, between 1 and `cap`, starting at `start`."""

    def __init__(self, start: int, cap: int, settings: TunerSettings | None = None) -> None:
        self.settings = settings or TunerSettings()
        self.cap = max(1, cap)
        self.limit = max(1, min(start, self.cap))
        self.phase = Phase.CLIMBING
        # A level the server could not hold (retracted, queued): not tried again until the
        # next re-probe.
        self._ceiling: int | None = None
        self._from: tuple[int, float] | None = None  # (level, rate) the last raise left
        self._rate: float | None = None  # the current level's measured rate
        self._skip = 1  # ticks to skip: the first one ramps up from nothing
        self._queued = 0.0  # the server's queue at the last measured tick
        self._trimmed = False  # the level was trimmed to the server's queue since the re-probe
        self._settled_ticks = 0

    def observe(self, sample: Sample) -> Decision:
        """Take one interval's figures and return the level for the next."""
        before = self.limit
        if self._skip:
            self._skip -= 1
            return Decision(before, before, "settling after a change")
        if not sample.saturated:
            return Decision(before, before, "slots not all busy: nothing measured")
        # SGLang admits optimistically and retracts the youngest when the KV pool runs out: a
        # few are its normal regulation, a share of what the server answers is work thrown away.
        if sample.retracted > max(1.0, self.settings.retract_share * sample.completed):
            return self._back_off(sample)
        # A request or two wait for the next prefill at any level; a queue that stays is the
        # server running fewer than it is sent (its KV pool or its own cap): no higher, and
        # down by what stays queued, less the margin that keeps its next admission waiting.
        # SGLang's own admission swings (its new-token ratio jumps at a retraction, then
        # decays), so one reading of its queue overstates it: the smaller of two is the part
        # that stays, and the level is trimmed once per settled stretch, not ratcheted down.
        queued = sample.queued if sample.queued is not None else 0.0
        queued_before, self._queued = self._queued, queued
        stays = min(queued, queued_before)
        if stays > self._queue_line(before):
            self._ceiling = min(self._ceiling or before, before)
            if not self._trimmed:
                self._trimmed = True
                fits = before - math.floor(stays) + math.ceil(self._queue_line(before))
                if fits < before:
                    why = f"{stays:g} of {before} stay queued on the server"
                    return self._settle(fits, sample.rate or 0.0, why)
        if sample.rate is None:
            return Decision(before, before, "no rate measured")
        rate = sample.rate
        if self.phase is Phase.SETTLED:
            self._rate = rate if self._rate is None else 0.5 * (self._rate + rate)
            self._settled_ticks += 1
            if self._settled_ticks >= self.settings.reprobe_every:
                # The workload may have changed since a back-off or a trim.
                self._ceiling, self._trimmed = None, False
                return self._raise(self._rate, Phase.PROBING, "re-probe", sample)
            return Decision(before, before, "settled")
        self._rate = rate
        if self._from is None:  # the start level's first measurement
            return self._raise(rate, Phase.CLIMBING, "first raise", sample)
        level, old = self._from
        gain = rate / old - 1 if old > 0 else math.inf
        if gain >= self.settings.min_gain:
            return self._raise(rate, Phase.CLIMBING, f"+{gain:.1%} at {before}", sample)
        # The raise did not pay for itself: back to where it was. More in flight for no more
        # throughput only holds KV and leaves more rows running at the end; and a plateau's
        # noise would otherwise ratchet the level up at every re-probe.
        return self._settle(level, old, f"{gain:+.1%} at {before}: back to {level}")

    def _queue_line(self, level: float) -> float:
        return max(2.0, self.settings.queue_share * level)

    def _raise(self, rate: float, phase: Phase, why: str, sample: Sample) -> Decision:
        before = self.limit
        top = self.cap if self._ceiling is None else min(self.cap, self._ceiling - 1)
        usage = sample.token_usage
        if usage is not None and usage >= self.settings.kv_headroom:
            return self._settle(before, rate, f"{why}; KV pool {usage:.0%} full")
        target = min(top, max(before + 1, math.ceil(before * self.settings.step)))
        if target <= before:
            held = "the server's cap" if top == self.cap else "where the server queued"
            return self._settle(before, rate, f"{why}; no higher than {held}, {top}")
        self._from = (before, rate)
        self.limit, self.phase, self._skip, self._queued = target, phase, 1, 0.0
        return Decision(target, before, why)

    def _settle(self, level: int, rate: float, why: str) -> Decision:
        before = self.limit
        self.limit, self._rate = level, rate
        self.phase, self._settled_ticks, self._from = Phase.SETTLED, 0, None
        if level != before:
            self._skip, self._queued = 1, 0.0  # a queue seen at the old level says nothing
        return Decision(level, before, why)

    def _back_off(self, sample: Sample) -> Decision:
        before = self.limit
        self._ceiling = before
        level = max(1, math.floor(before / self.settings.step))
        if self._from is not None and self._from[0] < before:
            level = self._from[0]  # the level this climb came from held
        why = f"{sample.retracted:g} retracted at {before}"
        return self._settle(level, self._rate or 0.0, why)
