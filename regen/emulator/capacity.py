"""The scheduler's capacity: at most N requests decode at once, the rest wait in FIFO order.

No per-token work: a request holds a slot for one sleep of its whole decode time, so
hundreds of open requests cost next to no CPU.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Slots:
    """A FIFO semaphore that also reports running and queued counts for the metrics."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return sum(not w.done() for w in self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting behind every earlier request when all are busy."""
        if self.running < self.limit and not self._waiters:
            self.running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot in the same tick it was cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Hand the slot straight to the oldest waiter, so no later arrival overtakes it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1
