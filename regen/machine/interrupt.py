"""What a signal does to a run started from a terminal: stop in seconds, say how to resume.

The first SIGINT (Ctrl-C), SIGTERM or SIGHUP unwinds the run as Ctrl-C does (KeyboardInterrupt:
every `finally` stops the fleet, the orchestrator records the run as crashed). Unwinding may
wait on things that are not ours (an orchestrator API that stopped answering), so a watchdog
thread bounds it: once `grace_s` has passed, or at a second signal, it stops the fleet from
the PID files, calls `on_force` (the orchestrator's temporary server) and exits with the
signal's code. A signal a parent set to be ignored (`nohup`, a background job of a
non-interactive shell ignores SIGINT) stays ignored: that is the user's choice.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code(sig: signal.Signals) -> int:
    """The shell's convention: 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + int(sig)


def signal_of(err: BaseException) -> signal.Signals:
    """The signal a KeyboardInterrupt stands for: its argument when raised here, else SIGINT."""
    name = str(err.args[0]) if err.args else ""
    return signal.Signals[name] if name in signal.Signals.__members__ else signal.SIGINT


def resume_command(argv: list[str]) -> str:
    """The command that resumes a run: the one typed, as a shell would take it back."""
    return shlex.join(["regen", *argv])


def resume_line(sig: signal.Signals, output: str | None, argv: list[str]) -> str:
    """The one line an interrupted run ends with: what stopped, what is kept, how to resume."""
    command = resume_command(argv)
    where = f" in {output}" if output else ""
    return (
        f"regen: interrupted by {sig.name}: the fleet was stopped and the committed shards"
        f"{where} are kept; run `{command}` again to resume"
    )


class Interrupts:
    """The run's signal handlers and its watchdog (see the module docstring)."""

    def __init__(
        self,
        *,
        line: Callable[[signal.Signals], str],
        stop_fleet: Callable[[], object],
        on_force: Callable[[], object] = lambda: None,
        grace_s: float = 20.0,
    ) -> None:
        self.line = line
        self.stop_fleet = stop_fleet
        self.on_force = on_force
        self.grace_s = grace_s
        self.received: signal.Signals | None = None
        self.said = False
        """Set once the resume line was printed by the unwound run: the watchdog says it once."""
        self._again = threading.Event()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.received is not None:
            # A second signal: the user will not wait; the watchdog stops everything now.
            self._again.set()
            return
        self.received = sig
        threading.Thread(target=self._watchdog, name="regen-interrupt", daemon=True).start()
        raise KeyboardInterrupt(sig.name)

    def _watchdog(self) -> None:
        self._again.wait(self.grace_s)
        assert self.received is not None
        try:
            self.stop_fleet()
        finally:
            try:
                self.on_force()
            finally:
                if not self.said:
                    # os.write, not print: the main thread may hold stderr's lock mid-unwind.
                    os.write(2, (self.line(self.received) + "\n").encode())
                os._exit(exit_code(self.received))

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        """Handle the signals for the body, then put back what was there."""
        previous = {}
        for sig in HANDLED:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN:
                continue  # nohup, or a background job: ignored on purpose
            previous[sig] = current
            signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def argv() -> list[str]:
    """This command's arguments, for the resume line."""
    return sys.argv[1:]
