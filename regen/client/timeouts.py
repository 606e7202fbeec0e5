"""Per-request deadlines derived from the speed the fleet actually delivers.

A fixed timeout is either too short for a 4096-token answer on a loaded server (work
thrown away and redone) or so long that a hung server holds its slots for an hour.
"""

from __future__ import annotations

from regen.client.tuning import DispatchTuning


class RequestTimeout:
    """`max(min, factor x max_tokens / per-request tok/s)`, tok/s an EWMA of completions.

    Only touched from the dispatcher's loop thread.
    """

    def __init__(self, max_tokens: int, tuning: DispatchTuning, fixed_s: float | None) -> None:
        self._max_tokens = max_tokens
        self._tuning = tuning
        self._fixed_s = fixed_s
        self._speed: float | None = None
        self.seconds = fixed_s if fixed_s is not None else tuning.initial_request_timeout_s

    def observe(self, tokens: int | None, latency_s: float) -> None:
        """Feed one successful request."""
        if self._fixed_s is not None or not tokens or latency_s <= 0:
            return
        speed = tokens / latency_s
        alpha = self._tuning.speed_ewma_alpha
        self._speed = speed if self._speed is None else self._speed + alpha * (speed - self._speed)
        derived = self._tuning.timeout_speed_factor * self._max_tokens / self._speed
        self.seconds = max(self._tuning.min_request_timeout_s, derived)
