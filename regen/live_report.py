"""The run's live figures: progress beside each server's own `/metrics`, every few seconds.

Apart from `regen.progress` (what `progress.json` holds): these are read from the servers, not
the dispatcher, and only a log line and an artifact show them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from regen.figures import NONE, pct, sig
from regen.fleet.metrics import FleetScraper, ServerFigures
from regen.progress import ProgressSnapshot, ProgressWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LiveReport:
    """The run's live figures: progress from the dispatcher, each server's from its /metrics."""

    at: float
    progress: ProgressSnapshot
    servers: tuple[ServerFigures, ...]

    def log_line(self) -> str:
        """One line for the run's log; a server without metrics says so."""
        parts = [f"live: {self.progress.headline()}"]
        for s in self.servers:
            m = s.metrics
            if m is None:
                parts.append(f"{s.name} metrics missing")
                continue
            parts.append(
                f"{s.name} {sig(s.tokens_per_s)} tok/s, {_count(m.running)} running, "
                f"{_count(m.queued)} queued, KV {pct(m.token_usage)}, "
                f"accept {sig(m.accept_length)}"
            )
        return "; ".join(parts)

    def to_markdown(self) -> str:
        """Headline, a narrow table (fits a ~1000 px pane), and missing servers named below."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
        lines = [
            f"**{self.progress.headline()}**",
            "",
            self.progress.audit_line(),
            "",
            f"Updated {stamp}; per-server figures from each server's `/metrics`.",
            "",
            "| server | tok/s | running | queued | KV cache | accept length |",
            "|---|--:|--:|--:|--:|--:|",
        ]
        missing = []
        for s in self.servers:
            m = s.metrics
            if m is None:
                missing.append(s)
                lines.append(
                    f"| {s.name} | **metrics missing** | {NONE} | {NONE} | {NONE} | {NONE} |"
                )
                continue
            lines.append(
                f"| {s.name} | {sig(s.tokens_per_s)} | {_count(m.running)} | {_count(m.queued)} | "
                f"{pct(m.token_usage)} | {sig(m.accept_length)} |"
            )
        if missing:
            lines += ["", "No `/metrics` answer (not counted as zero):", ""]
            lines += [f"- {s.name}: `{s.url}/metrics`" for s in missing]
        return "\n".join(lines) + "\n"


def _count(value: float | None) -> str:
    """Requests are whole; a missing gauge is `–`, not 0."""
    return NONE if value is None else f"{value:,.0f}"


class LiveWatch:
    """Every `interval_s`, scrape the fleet and hand a `LiveReport` to `on_update`, and once
    more on close; a failing callback is logged and tried again at the next tick."""

    def __init__(
        self,
        progress: ProgressWriter,
        scraper: FleetScraper,
        *,
        interval_s: float,
        on_update: Callable[[LiveReport], None],
    ) -> None:
        self._progress = progress
        self._scraper = scraper
        self._interval_s = interval_s
        self._on_update = on_update
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LiveWatch:
        self._thread = threading.Thread(target=self._run, name="regen-live", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if exc_type is None:
            self.tick()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.tick()

    def tick(self) -> LiveReport:
        report = LiveReport(time.time(), self._progress.snapshot(), tuple(self._scraper.scrape()))
        try:
            self._on_update(report)
        except Exception as err:
            log.warning("live report failed: %s", err)
        return report
