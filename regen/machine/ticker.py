"""One background ticker: a daemon thread that calls a function every `interval_s`.

The run has three (progress writes, the live report, lease renewals), and all three share one
error policy: a tick that raises is logged as a warning naming the ticker, and the next tick
goes on. Each tick redoes the whole job (write the latest progress, scrape again, renew every
held lease), so the next one repairs what a failed one missed; letting the exception end the
thread would instead stop that job silently for the rest of the run, and there is no caller
on this thread to raise it to. A tick that must not fail quietly (a lease lost) records that
in its owner's state rather than raising.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)


class Ticker:
    """Calls `tick` every `interval_s` from a daemon thread between `start` and `stop`."""

    def __init__(self, name: str, interval_s: float, tick: Callable[[], object]) -> None:
        self.name = name
        self._interval_s = interval_s
        self._tick = tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Ticker:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop ticking and wait for a tick under way to end; a no-op when not started."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Ticker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._tick()
            except Exception as err:
                log.warning(
                    "%s: tick failed, trying again in %g s: %s", self.name, self._interval_s, err
                )
