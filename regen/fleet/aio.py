"""Run a coroutine to completion from synchronous code, whatever thread calls it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, or the same in a helper thread when this thread already runs a loop
    (an async Prefect task), since a loop cannot be nested."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="regen-fleet") as pool:
        return pool.submit(asyncio.run, coro).result()
