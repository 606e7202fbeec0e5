"""Is a server ready? /health, /v1/models and one real generation, each with its own deadline.

The one probe of a server: the fleet's launch waits on it, and a quarantined server comes
back into the dispatcher only once it passes again. /health alone is not enough: it can
answer 200 while the scheduler is stuck (sglang#6624), so a server counts as ready only once
a chat completion came back with text, and not cut short (an overloaded or failing scheduler
aborts requests with what it decoded so far as their text). Probes are sequential per server
so a slow server never has probes piling up on it (sglang#35884).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from regen.config import SamplingConfig
from regen.errors import FleetUnauthorized
from regen.sglang_api.abort import ABORT
from regen.sglang_api.endpoint import CHAT_PATH, Endpoint
from regen.sglang_api.request import auth_headers, chat_request_body, request_id

PROBE_MESSAGES = [{"role": "user", "content": "Reply with one word: ready."}]


class ProbeSettings(BaseModel):
    """Deadlines of each probe step; the defaults suit a real GPU server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    health_timeout_s: float = Field(default=25.0, gt=0, description="/health waits 20 s itself.")
    models_timeout_s: float = Field(default=10.0, gt=0)
    generation_timeout_s: float = Field(default=60.0, gt=0)
    interval_s: float = Field(default=0.2, gt=0, description="Pause between readiness tries.")
    max_tokens: int = Field(default=16, ge=1)


@dataclass(frozen=True)
class ProbeTarget:
    """What a probe asks of every server: the served name, the key, the run's sampling."""

    served_name: str
    api_key: SecretStr
    sampling: SamplingConfig

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)


@dataclass(frozen=True)
class ProbeResult:
    """One probe's verdict; `retryable` says a later try may pass (still loading, a 503)."""

    ok: bool
    reason: str = ""
    retryable: bool = False
    latency_s: float | None = None


async def _get(
    session: aiohttp.ClientSession, url: str, timeout_s: float, headers: dict[str, str]
) -> tuple[int, Any]:
    async with session.get(
        url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as resp:
        body = await resp.json(content_type=None) if resp.status == 200 else None
        return resp.status, body


def _unauthorized(endpoint: Endpoint, path: str) -> FleetUnauthorized:
    return FleetUnauthorized(
        f"{endpoint.name} ({endpoint.url}) answered 401 on {path}: the API key is wrong"
    )


async def _generation(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    target: ProbeTarget,
    settings: ProbeSettings,
) -> ProbeResult:
    body = chat_request_body(
        target.served_name,
        PROBE_MESSAGES,
        target.sampling,
        rid=request_id("probe"),
        max_tokens=settings.max_tokens,
    )
    start = time.monotonic()
    try:
        async with session.post(
            endpoint.chat_url,
            json=body,
            headers=target.headers,
            timeout=aiohttp.ClientTimeout(total=settings.generation_timeout_s),
        ) as resp:
            if resp.status == 401:
                raise _unauthorized(endpoint, CHAT_PATH)
            if resp.status != 200:
                return ProbeResult(False, f"generation probe got HTTP {resp.status}", True)
            try:
                answer = await resp.json(content_type=None)
            except ValueError:  # a 200 that is not JSON: a proxy's page, a half-started server
                return ProbeResult(False, "generation probe answer is not JSON", True)
    except TimeoutError:
        # The sglang#6624 case: health is fine, the scheduler is not. Waiting longer won't help.
        return ProbeResult(
            False,
            f"generation probe timed out after {settings.generation_timeout_s:g} s "
            "although /health answered 200",
        )
    latency = time.monotonic() - start
    try:
        choice = answer["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return ProbeResult(False, "generation probe answer has no choices[0].message", True)
    if choice.get("finish_reason") == ABORT:
        # A cut answer carries what was decoded before the cut as its text: no proof that
        # the server generates (an overloaded or failing scheduler cuts every request).
        cut = "generation probe answer was cut short (finish_reason abort)"
        return ProbeResult(False, cut, True)
    if not (message.get("reasoning_content") or message.get("content")):
        return ProbeResult(False, "generation probe returned no text", True)
    return ProbeResult(True, latency_s=latency)


async def probe_server(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    target: ProbeTarget,
    settings: ProbeSettings,
) -> ProbeResult:
    """One full probe: health, model name, one generation. Raises FleetUnauthorized on 401."""
    try:
        status, _ = await _get(session, endpoint.url_of("/health"), settings.health_timeout_s, {})
        if status != 200:
            return ProbeResult(False, f"/health answered {status}", True)
        status, models = await _get(
            session, endpoint.url_of("/v1/models"), settings.models_timeout_s, target.headers
        )
        if status == 401:
            raise _unauthorized(endpoint, "/v1/models")
        if status != 200:
            return ProbeResult(False, f"/v1/models answered {status}", True)
        names = [m.get("id") for m in (models or {}).get("data", []) if isinstance(m, dict)]
        if target.served_name not in names:
            return ProbeResult(False, f"serves {names}, not {target.served_name!r}")
        return await _generation(session, endpoint, target, settings)
    except TimeoutError:
        return ProbeResult(False, "/health or /v1/models timed out", True)
    except aiohttp.ClientConnectorError:
        return ProbeResult(False, "connection refused", True)
    except aiohttp.ClientError as err:
        return ProbeResult(False, f"{type(err).__name__}: {err}", True)


async def reprobe(
    endpoint: Endpoint,
    target: ProbeTarget,
    settings: ProbeSettings,
    session: aiohttp.ClientSession | None = None,
) -> ProbeResult:
    """One probe of a quarantined server, with its own session unless one is given."""
    if session is not None:
        return await probe_server(session, endpoint, target, settings)
    async with aiohttp.ClientSession() as own:
        return await probe_server(own, endpoint, target, settings)
