"""The rates of a run: cumulative dispatcher counters turned into the last minute's figures."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from regen.client.stats import DispatchStats
from regen.progress.snapshot import ProgressSnapshot, ServerProgress


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    done: int
    tokens: int
    server_tokens: tuple[int, ...]


def _at(values: tuple[int, ...], i: int) -> int:
    return values[i] if i < len(values) else 0


class ProgressMeter:
    """Turns cumulative `DispatchStats` into rates over a sliding window (thread-safe)."""

    def __init__(self, total: int, *, already_done: int = 0, window_s: float = 60.0) -> None:
        self._total = total
        self._already_done = already_done
        self._window_s = window_s
        self._lock = threading.Lock()
        self._started = time.monotonic()
        # Nothing done at the start: a run shorter than the first tick still has a rate.
        self._samples: deque[_Sample] = deque([_Sample(self._started, 0, 0, ())])
        self._shards_committed = 0
        self._rows_committed = already_done

    def shard_committed(self, rows: int) -> None:
        with self._lock:
            self._shards_committed += 1
            self._rows_committed += rows

    def reused(self, rows: int) -> None:
        with self._lock:
            self._already_done += rows

    def snapshot(self, stats: DispatchStats) -> ProgressSnapshot:
        now = stats.monotonic
        sample = _Sample(
            now, stats.done, stats.output_tokens, tuple(s.output_tokens for s in stats.servers)
        )
        with self._lock:
            samples = self._samples
            samples.append(sample)
            # Keep one sample older than the window, so the rate always spans the window.
            while len(samples) > 2 and samples[1].at <= now - self._window_s:
                samples.popleft()
            oldest = samples[0]
            shards_committed, rows_committed = self._shards_committed, self._rows_committed
            already_done = self._already_done
        span = now - oldest.at

        def rate(new: int, old: int) -> float:
            return (new - old) / span if span > 0 else 0.0

        done = min(already_done + stats.done, self._total)
        remaining = self._total - done
        rows_per_s = rate(sample.done, oldest.done)
        eta = remaining / rows_per_s if rows_per_s > 0 else (0.0 if remaining == 0 else None)
        return ProgressSnapshot(
            updated_at=time.time(),
            elapsed_s=now - self._started,
            total=self._total,
            done=done,
            already_done=already_done,
            ok=stats.ok,
            failed=stats.failed,
            in_flight=stats.in_flight,
            queued=stats.queued,
            retries=stats.retries,
            shards_committed=shards_committed,
            rows_committed=rows_committed,
            output_tokens=stats.output_tokens,
            tokens_per_s=rate(sample.tokens, oldest.tokens),
            rows_per_s=rows_per_s,
            eta_s=eta,
            servers=tuple(
                ServerProgress(
                    name=s.name,
                    state=str(s.state),
                    in_flight=s.in_flight,
                    slots=s.slots,
                    tokens_per_s=rate(s.output_tokens, _at(oldest.server_tokens, i)),
                    output_tokens=s.output_tokens,
                )
                for i, s in enumerate(stats.servers)
            ),
        )
