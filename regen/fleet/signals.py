"""Tear the fleet down when the owning process is asked to stop (SIGTERM, Ctrl-C).

The default SIGTERM action kills the process without running `finally` blocks or atexit,
which is how servers used to outlive their run. The handler tears down first, then lets
the signal do what it did before: Ctrl-C still raises KeyboardInterrupt, SIGTERM exits.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from types import FrameType

from regen.fleet.handle import Fleet


def install_signal_teardown(
    fleet: Fleet, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> Callable[[], None]:
    """Install the handlers (main thread only, as Python requires); returns `restore`."""
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def handler(signum: int, frame: FrameType | None) -> None:
        fleet.teardown()
        restore()
        before = previous[signal.Signals(signum)]
        if callable(before):
            before(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        elif before != signal.SIG_IGN:
            raise SystemExit(128 + signum)

    for sig in previous:
        signal.signal(sig, handler)
    return restore
