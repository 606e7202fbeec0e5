"""Run the flow from the command line: one line on failure, signals stop the fleet."""

from __future__ import annotations

import signal
import sys
from types import FrameType

from regen.config import RegenConfig


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM becomes the same unwinding as Ctrl-C, so every `finally` tears the fleet down.
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_regenerate(config: RegenConfig) -> int:
    """Run `regenerate_completions` in this process; exit 0 on a passed or warned gate."""
    from flows.regenerate import regenerate_completions

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        state = regenerate_completions(config, return_state=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if state.is_completed():
        summary = state.result()
        print(f"dataset: {summary.output}")
        print(
            f"rows: {summary.rows_ok} ok, {summary.rows_failed} failed; "
            f"{summary.completion_tokens} tokens at {summary.tokens_per_s:.0f} tok/s"
        )
        print(f"audit: {summary.verdict} (report: {summary.output}/report/audit.md)")
        return 0
    message = (state.message or state.name).strip().splitlines()[0]
    print(f"regen: run {state.name.lower()}: {message}", file=sys.stderr)
    print(f"dataset: {config.output} (committed shards are kept)", file=sys.stderr)
    return 1
