"""`progress.json` rewritten every few seconds while a run generates, from a thread.

The file is rewritten atomically so that anyone watching the dataset root (an S3 console,
`regen status`) sees done/total, throughput and ETA without access to the node; the Prefect
layer mirrors the same snapshot into a progress artifact through `on_update`, so this module
never imports Prefect. On a terminal a progress bar shows the card's figures too.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any, Protocol

from regen.client.stats import DispatchStats
from regen.dataset.keys import progress_key
from regen.display.progress_bar import ProgressBar
from regen.machine.ticker import Ticker
from regen.progress.meter import ProgressMeter
from regen.progress.snapshot import ProgressSnapshot
from regen.storage import Storage

log = logging.getLogger(__name__)


class StatsSource(Protocol):
    def stats(self) -> DispatchStats: ...


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
        self._bar: ProgressBar | None = None
        self._audit: dict[str, Any] | None = None
        self._ended: ProgressSnapshot | None = None

    def start(self) -> ProgressWriter:
        if self._show_bar:
            self._bar = ProgressBar()
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
                self._bar.show(snap)
            return snap
