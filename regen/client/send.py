"""Sending: one request to one server, its deadline and what came back; an abort; a re-probe.

What a reply means for the row (retry, elsewhere, give up) is the scheduler's to decide
(regen.client.scheduler); this module only says what happened on the wire, as a `Reply`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from pydantic import SecretStr

from regen.client.shard_job import ShardJob
from regen.client.timeouts import RequestTimeout
from regen.client.tuning import DispatchTuning
from regen.config import RegenerationConfig, SamplingConfig
from regen.sglang_api.answer import Answer, read_answer
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeSettings, ProbeTarget, reprobe
from regen.sglang_api.request import chat_request_body

log = logging.getLogger(__name__)

Reprobe = Callable[[Endpoint], Awaitable[bool]]
# The transport: given the connection limit and the headers every request carries, a session
# for the dispatcher's loop (called there, closed by the dispatcher). Tests pass one that adds
# trace hooks; the default is `keepalive_session`.
SessionFactory = Callable[[int, dict[str, str]], aiohttp.ClientSession]


def keepalive_session(limit: int, headers: dict[str, str]) -> aiohttp.ClientSession:
    """One keep-alive connector of `limit` connections over every server."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
    # Headers set once on the session: merging them per request costs CPU.
    return aiohttp.ClientSession(connector=connector, headers=headers)


@dataclass(frozen=True, slots=True)
class Reply:
    """What one request got: an HTTP answer (`status`, `raw`), or a transport `failure` (a
    timeout, a broken connection: the server's fault, counted towards its quarantine), or an
    `unexpected` error of the client itself (costs the row one attempt, never hangs it)."""

    started: float
    latency: float
    status: int = 0
    raw: bytes = b""
    failure: str = ""
    unexpected: str = ""

    def answer(self) -> Answer | None:
        """The answer's meaning; None when no HTTP answer came back."""
        if self.failure or self.unexpected:
            return None
        return read_answer(self.status, self.raw)


class Sender:
    """Sends over the dispatcher's one session; lives on the dispatcher's loop."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        model: str,
        api_key: SecretStr,
        sampling: SamplingConfig,
        regeneration: RegenerationConfig,
        tuning: DispatchTuning,
        timeout: RequestTimeout,
        reprobe: Reprobe | None = None,
    ) -> None:
        self.session = session
        self._model = model
        self._api_key = api_key
        self._sampling = sampling
        self._regeneration = regeneration
        self._tuning = tuning
        self._timeout = timeout
        self._client_timeout = aiohttp.ClientTimeout(total=timeout.seconds)
        self._reprobe = reprobe

    async def send(self, endpoint: Endpoint, job: ShardJob, pos: int, rid: str) -> Reply:
        """POST the current turn of row `pos` of `job` under the current deadline
        (regen.client.timeouts)."""
        data = json.dumps(
            chat_request_body(
                self._model,
                job.prompt(pos),
                self._sampling,
                rid=rid,
                regeneration=self._regeneration,
                reasoning_effort=job.effort(pos),
                setting=job.setting(pos),
                tools=job.tools(pos),
                seed=job.seed(pos),
            )
        ).encode()
        if self._client_timeout.total != self._timeout.seconds:
            self._client_timeout = aiohttp.ClientTimeout(total=self._timeout.seconds)
        timeout = self._client_timeout
        started = time.monotonic()
        status = 0
        raw = b""
        failure = ""
        unexpected = ""
        try:
            async with self.session.post(endpoint.chat_url, data=data, timeout=timeout) as resp:
                status = resp.status
                raw = await resp.read()
        except TimeoutError:
            failure = f"timeout after {timeout.total:g} s"
        except (aiohttp.ClientError, OSError) as err:
            failure = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        except Exception as err:  # a client bug must cost one attempt, never hang the shard
            log.exception("unexpected error sending %s to %s", rid, endpoint.name)
            unexpected = f"unexpected {type(err).__name__}: {err}"
        return Reply(started, time.monotonic() - started, status, raw, failure, unexpected)

    async def abort(self, endpoint: Endpoint, rid: str) -> None:
        """POST /abort_request {"rid"}: the server frees the slot and answers the request
        with finish_reason abort. A failed abort costs only that copy's GPU time."""
        timeout = aiohttp.ClientTimeout(total=self._tuning.probe_timeout_s)
        try:
            async with self.session.post(
                endpoint.abort_url, json={"rid": rid}, timeout=timeout
            ) as resp:
                await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            log.info("abort of %s on %s failed: %s", rid, endpoint.name, err)

    async def probe(self, endpoint: Endpoint) -> bool:
        """Whether a quarantined server serves again; raises `FleetUnauthorized` for a 401."""
        timeout = self._tuning.probe_timeout_s
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel that lands
        # as the probe ends, and close() then waits on a probe loop that never stops.
        try:
            if self._reprobe is not None:
                async with asyncio.timeout(timeout):
                    return await self._reprobe(endpoint)
            # Without a fleet's own re-probe, the probe a fleet's launch uses, each of its
            # steps within the one re-probe deadline.
            settings = ProbeSettings(
                health_timeout_s=timeout, models_timeout_s=timeout, generation_timeout_s=timeout
            )
            target = ProbeTarget(self._model, self._api_key, self._sampling)
            async with asyncio.timeout(timeout):
                result = await reprobe(endpoint, target, settings, self.session)
        except TimeoutError:
            return False
        return result.ok


def backoff(attempts: int, tuning: DispatchTuning) -> float:
    """The delay before a failed row's next attempt (before jitter): doubling from
    `retry_backoff_s` up to `retry_backoff_max_s`."""
    return min(tuning.retry_backoff_max_s, tuning.retry_backoff_s * 2 ** (attempts - 1))
