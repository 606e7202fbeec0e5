"""The fleet's live figures: progress beside each server's own `/metrics`, every few seconds.

Apart from `regen.progress.snapshot` (what `progress.json` holds): these are read from the
servers, not the dispatcher, and only a log line and an artifact show them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from regen.display.figures import NONE, markdown_table, pct, sig
from regen.display.progress import audit_line, progress_card, progress_headline
from regen.fleet.metrics import FleetScraper, ServerFigures
from regen.fleet.report import FleetRow
from regen.machine.ticker import Ticker
from regen.progress.snapshot import ProgressSnapshot
from regen.progress.writer import ProgressWriter

log = logging.getLogger(__name__)


HISTORY_ROWS = 240
"""Rows of the throughput table at most: a three-day run scraped every 30 s has 8,640
intervals, merged into this many spans (each its intervals' mean), so the table stays small
enough to rewrite at every scrape."""


@dataclass(frozen=True, slots=True)
class Interval:
    """One scrape's figures, kept for the run's throughput history."""

    at: float
    done: int
    tokens_per_s: float
    """The dispatcher's rate, as in the headline."""
    servers: tuple[float | None, ...]
    """Each server's rate over the interval from its own counter (None: no `/metrics`)."""


@dataclass(frozen=True, slots=True)
class LiveReport:
    """The run's live figures: progress from the dispatcher, each server's from its /metrics."""

    at: float
    progress: ProgressSnapshot
    servers: tuple[ServerFigures, ...]
    history: tuple[Interval, ...] = ()
    fleet: tuple[FleetRow, ...] = ()
    """The fleet report as it stands: each server's relaunches and cut answers, which are out."""

    @property
    def relaunches(self) -> int:
        return sum(r.relaunches for r in self.fleet)

    @property
    def cut_answers(self) -> int:
        return sum(r.cut_answers for r in self.fleet)

    def relaunch_lines(self) -> list[str]:
        """Per server that had trouble: `server-1: relaunched 2x (last: <cause>)` or
        `server-1: out for the rest of the run: <why>`, then `; 12 answers cut` if it cut any."""
        lines = []
        for row in self.fleet:
            said = ""
            if row.status == "out":
                said = f"out for the rest of the run: {row.reason}"
            elif row.relaunches:
                last = row.relaunch_causes[-1] if row.relaunch_causes else ""
                said = f"relaunched {row.relaunches}x (last: {last})"
            if row.cut_answers:
                said += f"{'; ' if said else ''}{_cut(row.cut_answers)}"
            if said:
                lines.append(f"{row.server}: {said}")
        return lines

    def history_table(self, max_rows: int = HISTORY_ROWS) -> list[dict[str, str]]:
        """How throughput moved over the run: one row per interval, or per span of
        consecutive intervals (their mean) when there are more than `max_rows`."""
        names = [s.name for s in self.servers]
        per = -(-len(self.history) // max_rows) if self.history else 1
        rows = []
        for start in range(0, len(self.history), per):
            span = self.history[start : start + per]
            last = span[-1]
            row = {
                "time (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(last.at)),
                "rows done": f"{last.done:,}",
                "output tok/s": sig(sum(i.tokens_per_s for i in span) / len(span)),
            }
            for k, name in enumerate(names):
                rates = [i.servers[k] for i in span if k < len(i.servers)]
                known = [r for r in rates if r is not None]
                row[f"{name} tok/s"] = sig(sum(known) / len(known)) if known else NONE
            rows.append(row)
        return rows

    def server_rate(self, server: ServerFigures) -> float | None:
        """A server's tok/s as the report shows it: over the last interval from its own
        counter while the run goes; once generation is over, its run average from the
        dispatcher (the last interval is the drain: a server finishing its last rows read
        775 tok/s beside peers at 4,000), so the servers add up to the headline's figure."""
        if self.progress.ended:
            for s in self.progress.servers:
                if s.name == server.name:
                    return s.tokens_per_s
        return server.tokens_per_s

    def concurrency(self, server: ServerFigures) -> str:
        """Requests regen keeps in flight on a server (its slots: measured per server unless
        fixed), `–` for a server the dispatcher does not know."""
        for s in self.progress.servers:
            if s.name == server.name:
                return f"{s.slots:,}"
        return NONE

    def card(self) -> str:
        """The card's figure: the progress's, as the progress artifact says it, then the
        servers relaunched or out, if any."""
        out = sum(r.status == "out" for r in self.fleet)
        notes = [f"{self.relaunches} relaunched"] if self.relaunches else []
        notes += [f"{out} server{'s' if out > 1 else ''} out"] if out else []
        notes += [f"{self.cut_answers:,} cut"] if self.cut_answers else []
        return " · ".join([progress_card(self.progress), *notes])

    def log_line(self) -> str:
        """One line for the run's log; a server without metrics says so."""
        parts = [f"live: {progress_headline(self.progress)}"]
        for s in self.servers:
            m = s.metrics
            if m is None:
                parts.append(f"{s.name} metrics missing")
                continue
            parts.append(
                f"{s.name} {sig(self.server_rate(s))} tok/s, concurrency {self.concurrency(s)}, "
                f"{_count(m.running)} running, "
                f"{_count(m.queued)} queued, KV {pct(m.token_usage)}, "
                f"accept {sig(m.accept_length)}"
            )
        if self.relaunches:
            parts.append(f"{self.relaunches} relaunch(es)")
        if self.cut_answers:
            parts.append(_cut(self.cut_answers))
        return "; ".join(parts)

    def to_markdown(self) -> str:
        """Headline, a narrow table (fits a ~1000 px pane), and missing servers named below."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
        lines = [
            f"**{progress_headline(self.progress)}**",
            "",
            audit_line(self.progress),
            "",
            f"Updated {stamp}; per-server figures from each server's `/metrics`"
            + (", tok/s the run's average." if self.progress.ended else "."),
            "",
        ]
        missing = [s for s in self.servers if s.metrics is None]
        lines += markdown_table(
            ["server", "tok/s", "concurrency", "running", "queued", "KV cache", "accept length"],
            (
                (s.name, "**metrics missing**", self.concurrency(s), NONE, NONE, NONE, NONE)
                if (m := s.metrics) is None
                else (
                    s.name,
                    sig(self.server_rate(s)),
                    self.concurrency(s),
                    _count(m.running),
                    _count(m.queued),
                    pct(m.token_usage),
                    sig(m.accept_length),
                )
                for s in self.servers
            ),
            numeric={"tok/s", "concurrency", "running", "queued", "KV cache", "accept length"},
        )
        if missing:
            lines += ["", "No `/metrics` answer (not counted as zero):", ""]
            lines += [f"- {s.name}: `{s.url}/metrics`" for s in missing]
        if relaunched := self.relaunch_lines():
            lines += ["", "Relaunched (`engine.relaunch`), out, or cutting answers short:", ""]
            lines += [f"- {line}" for line in relaunched]
        return "\n".join(lines) + "\n"


def _cut(answers: int) -> str:
    return f"{answers:,} answer{'s' if answers != 1 else ''} cut"


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
        fleet: Callable[[], Sequence[FleetRow]] = tuple,
    ) -> None:
        self._progress = progress
        self._fleet = fleet
        self._scraper = scraper
        self._on_update = on_update
        self._ticker = Ticker("regen-live", interval_s, self.tick)
        self._history: list[Interval] = []

    def __enter__(self) -> LiveWatch:
        # The counters at the start: every report's tok/s is then a rate over its interval.
        self._scraper.prime()
        self._ticker.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ticker.stop()
        if exc_type is None:
            self.tick()

    def tick(self) -> LiveReport:
        at, progress, servers = time.time(), self._progress.snapshot(), self._scraper.scrape()
        rates = tuple(s.tokens_per_s for s in servers)
        self._history.append(Interval(at, progress.done, progress.tokens_per_s, rates))
        report = LiveReport(
            at, progress, tuple(servers), tuple(self._history), tuple(self._fleet())
        )
        try:
            self._on_update(report)
        except Exception as err:
            log.warning("live report failed: %s", err)
        return report
