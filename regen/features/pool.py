"""The capture fleet's client: requests spread over the servers, a slot limit per server,
a failed request tried on another server, all on one event loop of its own.

The shards' tasks run in threads (Prefect's task runner); `submit` hands a request to the
pool's loop and returns a plain future, so several shards feed the fleet at once and no
server idles at a shard's border. What the dispatcher of stage 4 does for chats (affinity,
hedging, the live gate) a prefill over known ids needs none of.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from regen.features.capture import (
    GENERATE_PATH,
    Captured,
    CaptureError,
    read_keyed,
    request_body,
)
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import auth_headers


class SampleRefused(Exception):
    """The server refused the sample itself (a 400: longer than the context): no retry."""


@dataclass(frozen=True)
class CaptureServer:
    endpoint: Endpoint
    capture_dir: Path


@dataclass
class _Slots:
    server: CaptureServer
    in_flight: int = 0
    failures: int = 0


@dataclass
class PoolStats:
    """What the pool did, for the progress and the bench."""

    requests: int = 0
    retries: int = 0
    by_server: dict[str, int] = field(default_factory=dict)


class CapturePool:
    """Captures over `servers`, `concurrency` requests in flight on each."""

    def __init__(
        self,
        servers: Sequence[CaptureServer],
        api_key: SecretStr,
        concurrency: int,
        max_attempts: int = 3,
        timeout_s: float = 1800.0,
    ) -> None:
        if not servers:
            raise ValueError("a capture pool needs at least one server")
        self._slots = [_Slots(s) for s in servers]
        self._headers = auth_headers(api_key)
        self._concurrency = concurrency
        self._attempts = max_attempts
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.stats = PoolStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._free: asyncio.Condition | None = None

    @property
    def slots(self) -> int:
        return len(self._slots) * self._concurrency

    def submit(self, input_ids: list[int]) -> futures.Future[Captured]:
        """Capture one sample; the future's error is SampleRefused or CaptureError."""
        assert self._loop is not None, "submit within `running()`"
        return asyncio.run_coroutine_threadsafe(self.capture(input_ids), self._loop)

    async def capture(self, input_ids: list[int]) -> Captured:
        last: Exception | None = None
        for attempt in range(self._attempts):
            slot = await self._acquire()
            try:
                return await self._send(slot, input_ids)
            except SampleRefused:
                raise
            except (aiohttp.ClientError, TimeoutError, CaptureError) as err:
                slot.failures += 1
                last = err
                self.stats.retries += attempt + 1 < self._attempts
            finally:
                await self._release(slot)
        raise CaptureError(f"no server captured the sample in {self._attempts} tries: {last}")

    async def _send(self, slot: _Slots, input_ids: list[int]) -> Captured:
        assert self._session is not None
        endpoint = slot.server.endpoint
        body = request_body(input_ids, f"regen-features-{uuid.uuid4().hex}")
        async with self._session.post(endpoint.url_of(GENERATE_PATH), json=body) as response:
            if response.status == 400:
                raise SampleRefused((await response.text())[:300])
            if response.status != 200:
                raise CaptureError(f"{endpoint.name}: HTTP {response.status}")
            answer = await response.json(content_type=None)
        self.stats.requests += 1
        self.stats.by_server[endpoint.name] = self.stats.by_server.get(endpoint.name, 0) + 1
        # The file read is disk (a RAM disk) and numpy: off the loop, so it keeps sending.
        return await asyncio.to_thread(read_keyed, answer, input_ids, slot.server.capture_dir)

    async def _acquire(self) -> _Slots:
        assert self._free is not None
        async with self._free:
            while True:
                open_ = [s for s in self._slots if s.in_flight < self._concurrency]
                if open_:
                    # Fewest in flight, then fewest failures: a failing server gets less.
                    slot = min(open_, key=lambda s: (s.in_flight, s.failures))
                    slot.in_flight += 1
                    return slot
                await self._free.wait()

    async def _release(self, slot: _Slots) -> None:
        assert self._free is not None
        async with self._free:
            slot.in_flight -= 1
            self._free.notify()

    @contextmanager
    def running(self) -> Iterator[CapturePool]:
        """The pool's loop in a thread of its own, for `submit`, closed on exit."""
        ready = threading.Event()
        stop: asyncio.Future[None] | None = None

        async def main() -> None:
            nonlocal stop
            self._loop = asyncio.get_running_loop()
            self._free = asyncio.Condition()
            stop = self._loop.create_future()
            async with aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout
            ) as session:
                self._session = session
                ready.set()
                await stop

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        ready.wait()
        try:
            yield self
        finally:
            loop = self._loop
            assert loop is not None and stop is not None
            loop.call_soon_threadsafe(_settle, stop)
            thread.join(timeout=30)


def _settle(stop: asyncio.Future[None]) -> None:
    if not stop.done():
        stop.set_result(None)
