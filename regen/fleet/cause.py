"""Why a server went down, as every report of it says it: one line, and its log's last words.

A relaunch is logged with its cause and the last lines of the server's log (redacted by
`ServerProcess.log_tail`); the fleet report keeps one line a relaunch; a server that stays
out, and a fleet that is gone, are one line each with the log's most telling line and path.
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
_WORDS_MAX = 200


def exit_text(code: int) -> str:
    """`exited with code 1`, or `killed by SIGKILL (exit code -9)`."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


def last_words(tail: str) -> str:
    """The log's last line that says what went wrong, else its last line."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    lines = [line for line in lines if not _ARGUMENTS.search(line)] or lines
    telling = [line for line in lines if _TELLING.search(line)]
    return _cut((telling or lines or ["(nothing logged)"])[-1], _WORDS_MAX)


def _cut(line: str, most: int = 2 * _WORDS_MAX) -> str:
    """A log line short enough to read (SGLang logs all its arguments on one)."""
    return line if len(line) <= most else line[: most - 1] + "…"


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

    def with_log(self, then: str) -> str:
        """`what; then`, and the last lines of its log below, for the run's log."""
        if not self.tail:
            return f"{self.what}; {then}"
        lines = "\n".join(f"  | {_cut(line)}" for line in self.tail.splitlines())
        return f"{self.what}; {then}; last lines of {self.log_path}:\n{lines}"

    def out_line(self, since: float, relaunches: int) -> str:
        """Why a server stays out, in one line (the dispatcher's `FleetGone` quotes it)."""
        tries = f"{relaunches} relaunch{'es' if relaunches != 1 else ''} did not bring it back"
        if not relaunches:
            tries = "relaunch is off (engine.relaunch.max_restarts 0)"
        said = f"; its log says {last_words(self.tail)!r}" if self.tail else ""
        return f"down since {clock(since)}, {tries}: {self.what}{said} (log: {self.log_path})"
