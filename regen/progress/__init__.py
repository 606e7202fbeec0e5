"""Progress of a run: a snapshot built from dispatcher stats, written to `progress.json`.

The file is rewritten atomically every few seconds so that anyone watching the dataset
root (an S3 console, `regen status`) sees done/total, throughput and ETA without access
to the node; the Prefect layer mirrors the same snapshot into a progress artifact
through `on_update`, so this module never imports Prefect.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import Any, Protocol

from rich.progress import Progress, TaskID

from regen.client.stats import DispatchStats
from regen.dataset.keys import progress_key
from regen.display.figures import NONE, compact, duration, eta, markdown_table, pct, sig
from regen.machine.ticker import Ticker
from regen.storage import Storage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerProgress:
    name: str
    state: str
    in_flight: int
    slots: int
    tokens_per_s: float
    output_tokens: int = 0
    """This run's output tokens from the server: over the elapsed time, its run average."""


@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """`done` includes rows committed by earlier runs (`already_done`); rates are this run's.

    Two counts of rows, never mixed: `done` rows were generated (answered by a server),
    `rows_committed` are in the dataset (their shard's manifest is written). A stopped run
    generated rows it never committed; every report names which one it shows."""

    updated_at: float
    elapsed_s: float
    total: int
    done: int
    already_done: int
    ok: int
    failed: int
    in_flight: int
    queued: int
    retries: int
    shards_committed: int
    rows_committed: int
    output_tokens: int
    tokens_per_s: float
    """The last minute's rate while the run goes; once it has ended, the run's average."""
    rows_per_s: float
    eta_s: float | None
    servers: tuple[ServerProgress, ...]
    audit: dict[str, Any] | None = None
    """The rolling audit's running figures (`regen.audit.gate.running_figures`), once a shard
    has committed."""
    ended: str | None = None
    """How generation ended (`finished`, or `stopped: <the gate's verdict>`), once it has."""

    @property
    def fraction(self) -> float:
        """The share of the plan generated."""
        return min(self.done / self.total, 1.0) if self.total else 1.0

    @property
    def committed_fraction(self) -> float:
        """The share of the plan in the dataset."""
        return min(self.rows_committed / self.total, 1.0) if self.total else 1.0

    @property
    def stopped(self) -> bool:
        return bool(self.ended and self.ended.startswith("stopped"))

    @property
    def shown_fraction(self) -> float:
        """What a progress bar shows: the share generated, but for a stopped run the share
        committed (its generated rows past the last commit are not in the dataset)."""
        return self.committed_fraction if self.stopped else self.fraction

    def as_ended(self, how: str) -> ProgressSnapshot:
        """The snapshot of a run that is over: no ETA (a stopped one would show the time its
        rest would have taken), and every rate its run average, not the last minute's drain
        (a server finishing its last rows looked sick beside its peers)."""
        span = self.elapsed_s

        def mean(tokens: int) -> float:
            return tokens / span if span > 0 else 0.0

        return replace(
            self,
            ended=how,
            eta_s=None,
            tokens_per_s=mean(self.output_tokens),
            servers=tuple(replace(s, tokens_per_s=mean(s.output_tokens)) for s in self.servers),
        )

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "fraction": self.fraction}, indent=2).encode()

    def rows_line(self) -> str:
        """`496 / 6,000 rows generated (8.27 %), 0 committed`: both counts, each named."""
        return (
            f"{self.done:,} / {self.total:,} rows generated ({pct(self.fraction)}), "
            f"{self.rows_committed:,} committed"
        )

    def rate_line(self) -> str:
        """The one throughput figure: the last minute's, or the run's average once over."""
        return f"{sig(self.tokens_per_s)} output tok/s" + (" (run average)" if self.ended else "")

    def headline(self) -> str:
        """Rows generated and committed, speed and ETA in one line: the log's and every
        report's first words."""
        return f"{self.rows_line()}, {self.failed:,} failed this run; {self.rate_line()}; " + (
            self.ended or eta(self.updated_at, self.eta_s)
        )

    def quality(self) -> str:
        """The rolling audit in a word: `quality ok`, `quality warn`, `quality FAIL`, or `–`
        before its first shard."""
        checks = (self.audit or {}).get("checks", {})
        if not self.audit:
            return f"quality {NONE}"
        statuses = {v.get("status") for v in checks.values()}
        if self.audit.get("quarantined") and "fail" not in statuses:
            return "quality warn"
        worst = "FAIL" if "fail" in statuses else "warn" if "warn" in statuses else "ok"
        return f"quality {worst}"

    def card(self) -> str:
        """The figure a Prefect card shows before it cuts (~50 characters), most telling first:
        `82 % · ETA 00:55 UTC (24 s) · 64.3k tok/s · quality ok`; the rest follows it."""
        rate = f"{compact(self.tokens_per_s)} tok/s"
        if self.stopped:
            assert self.ended is not None
            return (
                f"stopped · {self.rows_committed:,} / {self.total:,} committed "
                f"({self.done:,} generated) · {self.ended.removeprefix('stopped: ')}"
            )
        if self.ended:
            return (
                f"{pct(self.fraction)} · {self.ended} in {duration(self.elapsed_s)} · "
                f"{rate} · {self.quality()}"
            )
        ahead = eta(self.updated_at, self.eta_s)
        return f"{pct(self.fraction)} · {ahead} · {rate} · {self.quality()}"

    def audit_line(self) -> str:
        """The rolling audit in one line: rows behind it, each failing or warning check."""
        if not self.audit:
            return self.ended or "rolling audit: no shard committed yet"
        checks = self.audit.get("checks", {})
        loud = [f"{k} {pct(v['figure'])} {v['status']}" for k, v in checks.items()
                if v.get("status") in ("fail", "warn")]  # fmt: skip
        quarantined = self.audit.get("quarantined") or []
        return (
            f"rolling audit over {self.audit.get('rows', 0):,} rows: "
            + (", ".join(loud) or "every check within thresholds")
            + (f"; quarantined {', '.join(quarantined)}" if quarantined else "")
        )

    def to_markdown(self) -> str:
        """The end of generation: the headline (a run that is over shows its run averages,
        the one throughput every report quotes), the audit, then each server."""
        rates = "run average" if self.ended else "last minute"
        lines = [
            f"**{self.headline()}**",
            "",
            f"This run: {self.output_tokens:,} output tokens in {duration(self.elapsed_s)}; "
            f"{self.retries:,} retries.",
            "",
            self.audit_line(),
            "",
            *markdown_table(
                ["server", "state", "in flight", f"tok/s ({rates})"],
                (
                    (s.name, s.state, f"{s.in_flight}/{s.slots}", sig(s.tokens_per_s))
                    for s in self.servers
                ),
                numeric={"in flight", f"tok/s ({rates})"},
            ),
        ]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    done: int
    tokens: int
    server_tokens: tuple[int, ...]


def _at(values: tuple[int, ...], i: int) -> int:
    return values[i] if i < len(values) else 0


class StatsSource(Protocol):
    def stats(self) -> DispatchStats: ...


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
        span = now - oldest.at

        def rate(new: int, old: int) -> float:
            return (new - old) / span if span > 0 else 0.0

        with self._lock:
            already_done = self._already_done
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


class ProgressWriter:
    """Rewrites `progress.json` every `interval_s` from a background thread, and on close.

    A failed write (an S3 hiccup) or a failing `on_update` is logged and retried at the
    next tick: progress must never stop the generation.
    """

    def __init__(
        self,
        storage: Storage,
        dispatcher: StatsSource,
        *,
        total: int,
        already_done: int = 0,
        interval_s: float = 2.0,
        on_update: Callable[[ProgressSnapshot], None] | None = None,
        show_bar: bool | None = None,
        window_s: float = 60.0,
        key: str = progress_key(),
    ) -> None:
        self._storage = storage
        self._dispatcher = dispatcher
        self._meter = ProgressMeter(total, already_done=already_done, window_s=window_s)
        self._on_update = on_update
        self._show_bar = sys.stdout.isatty() if show_bar is None else show_bar
        self._key = key
        self._write_lock = threading.Lock()  # the final write must not interleave with a tick
        self._ticker = Ticker("regen-progress", interval_s, self.write_now)
        self._bar: Progress | None = None
        self._bar_task: TaskID | None = None
        self._audit: dict[str, Any] | None = None
        self._ended: ProgressSnapshot | None = None

    def start(self) -> ProgressWriter:
        if self._show_bar:
            self._bar = Progress()
            self._bar.start()
        self._ticker.start()
        return self

    def close(self) -> None:
        self._ticker.stop()
        self.write_now()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> ProgressWriter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def shard_committed(self, rows: int, ok: int = 0, failed: int = 0) -> None:
        """Count a shard whose manifest is written (`ok`/`failed` are in the dispatcher's)."""
        self._meter.shard_committed(rows)

    def reused(self, rows: int) -> None:
        """Count rows an earlier run generated and this one reuses (a cut-short run's stored
        canary rows), which no answer of this run's dispatcher counts."""
        self._meter.reused(rows)

    def set_audit(self, figures: dict[str, Any]) -> None:
        """The rolling audit's latest figures, written with the next progress."""
        self._audit = figures

    def end(self, how: str) -> None:
        """Generation is over (`finished`, `stopped: ...`): said by every later snapshot, the
        last writes on close included, so no report is left saying a run is under way. The
        figures are taken now and kept: a run average over a clock still running after the
        end would read lower in each later report (185,000 tok/s in one, 190,000 in another)."""
        self._ended = self._meter.snapshot(self._dispatcher.stats()).as_ended(how)

    def snapshot(self) -> ProgressSnapshot:
        snap = replace(self._meter.snapshot(self._dispatcher.stats()), audit=self._audit)
        if self._ended is None:
            return snap
        # The ended figures as taken; what is still in flight (answers the end left behind,
        # being aborted) as it is now.
        servers = tuple(
            replace(kept, state=now.state, in_flight=now.in_flight)
            for kept, now in zip(self._ended.servers, snap.servers, strict=False)
        )
        return replace(
            self._ended, audit=self._audit, in_flight=snap.in_flight, queued=snap.queued,
            servers=servers,
        )  # fmt: skip

    def write_now(self) -> ProgressSnapshot:
        with self._write_lock:
            snap = self.snapshot()
            try:
                self._storage.write_bytes(self._key, snap.to_json())
            except Exception as err:
                log.warning("could not write %s: %s", self._key, err)
            if self._on_update is not None:
                try:
                    self._on_update(snap)
                except Exception as err:
                    log.warning("progress callback failed: %s", err)
            if self._bar is not None:
                self._update_bar(self._bar, snap)
            return snap

    def _update_bar(self, bar: Progress, snap: ProgressSnapshot) -> None:
        # The card's figures, as the UI shows them (the bar draws the share itself).
        ahead = snap.ended or eta(snap.updated_at, snap.eta_s)
        text = f"{compact(snap.tokens_per_s)} tok/s · {ahead} · {snap.failed:,} failed"
        if self._bar_task is None:
            self._bar_task = bar.add_task(text, total=snap.total)
        bar.update(self._bar_task, completed=snap.done, total=snap.total, description=text)


def mark_state(storage: Storage, state: str, node: str | None = None) -> str:
    """Add how the run's process ended (`Cancelled`, `Crashed`) to its last progress, or to
    an empty one: a watcher of the root sees that no snapshot will follow. The key written."""
    key = progress_key(node)
    try:
        progress = json.loads(storage.read_bytes(key))
    except (FileNotFoundError, ValueError):
        progress = {}
    if not isinstance(progress, dict):
        progress = {}
    progress["state"] = state
    storage.write_bytes(key, json.dumps(progress, indent=2).encode())
    return key
