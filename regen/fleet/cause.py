"""Why a server went down, as every report of it says it: one line, and its log's last words.

A relaunch is one line of the run's log: its cause, the log's telling line and the log's
path; the last lines of the log (redacted by `ServerProcess.log_tail`) go to the fleet report
(`report/fleet.json`) and stay in the log itself. Before, each relaunch printed 4-8 lines of the
tail, and a fleet that could not come back filled 60 lines of a 106-line output with them. A
server that stays out, and a fleet that is gone, are one line each too.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

# A line that says what went wrong, preferred over the log's last line (often a request's);
# never the launch's dump of every argument, whose names say `abort` and `timeout`.
_TELLING = re.compile(
    r"\w*(Error|Exception)\b|\bexception\b|Traceback|\b(FATAL|[Ff]atal|Killed|NCCL|OOM|failed)\b"
    r"|CUDA error|out of memory|[Cc]ould not|[Cc]annot"
)
_ARGUMENTS = re.compile(r"server_args\s*=")
# SGLang's own time stamp, `[2026-12-07 05:58:01] ` or `[2026-12-07 05:58:01 TP0] `: the line
# that quotes it has its own.
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\]\s*")
_WORDS_MAX = 200


def exit_text(code: int) -> str:
    """`exited with code 1`, or `killed by SIGKILL (exit code -9)`."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


def _lines(tail: str) -> list[str]:
    lines = [_STAMP.sub("", line.strip()) for line in tail.splitlines()]
    lines = [line for line in lines if line]
    return [line for line in lines if not _ARGUMENTS.search(line)] or lines


def telling_line(tail: str) -> str:
    """The log's last line that says what went wrong, or "" (a process killed by a signal
    writes nothing about it: its last line is a request's, which tells nothing)."""
    telling = [line for line in _lines(tail) if _TELLING.search(line)]
    return _cut(telling[-1]) if telling else ""


def last_words(tail: str) -> str:
    """The log's last line that says what went wrong, else its last line."""
    return telling_line(tail) or _cut((_lines(tail) or ["(nothing logged)"])[-1])


def _cut(line: str) -> str:
    """A log line short enough to read (SGLang logs all its arguments on one)."""
    return line if len(line) <= _WORDS_MAX else line[: _WORDS_MAX - 1] + "…"


def clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


@dataclass(frozen=True)
class Cause:
    """One reason a server is down: `what` in a line, the tail of its log, where that is."""

    what: str
    log_path: Path
    tail: str = ""
    at: float = field(default_factory=time.time)

    def line(self) -> str:
        """`2026-12-07 12:03:04 UTC: exited with code 1: RuntimeError: CUDA error ...`."""
        said = f": {last_words(self.tail)}" if self.tail else ""
        return f"{clock(self.at)}: {self.what}{said}"

    def log_line(self, then: str) -> str:
        """`what: its log's telling line; then; log: PATH` in one line, for the run's log (the
        tail itself goes to the fleet report)."""
        said = telling_line(self.tail)
        said = f": {said}" if said else ""
        return f"{self.what}{said}; {then}; log: {self.log_path}"

    def same_as(self, other: Cause) -> bool:
        """The same failure, whenever it happened: what, and the log's telling line."""
        return (self.what, telling_line(self.tail)) == (other.what, telling_line(other.tail))

    def out_line(self, since: float, relaunches: int) -> str:
        """Why a server stays out, in one line (the dispatcher's `FleetGone` quotes it)."""
        tries = f"{relaunches} relaunch{'es' if relaunches != 1 else ''} did not bring it back"
        if not relaunches:
            tries = "relaunch is off (engine.relaunch.max_restarts 0)"
        said = f"; its log says {last_words(self.tail)!r}" if self.tail else ""
        return f"down since {clock(since)}, {tries}: {self.what}{said} (log: {self.log_path})"
