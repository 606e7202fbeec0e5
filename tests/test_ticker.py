"""The one background ticker's error policy: a failing tick is logged and the next one runs."""

from __future__ import annotations

import logging
import threading

import pytest

from regen.machine.ticker import Ticker


def test_a_failing_tick_is_logged_and_the_ticker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    recovered = threading.Event()

    def tick() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("storage hiccup")
        recovered.set()

    with caplog.at_level(logging.WARNING, logger="regen.machine.ticker"), Ticker("t", 0.01, tick):
        assert recovered.wait(10), "the ticker stopped after its first failing tick"
    assert len(calls) >= 2
    assert any(
        "t: tick failed" in r.message and "storage hiccup" in r.message for r in caplog.records
    )


def test_stop_ends_the_thread_and_no_tick_follows() -> None:
    ticked = threading.Event()
    calls: list[int] = []

    def tick() -> None:
        calls.append(1)
        ticked.set()

    ticker = Ticker("t", 0.01, tick).start()
    assert ticked.wait(10)
    ticker.stop()
    assert not [t for t in threading.enumerate() if t.name == "t"]
    ticker.stop()  # a second stop is a no-op
