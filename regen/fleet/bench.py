"""A short fixed load on every healthy server at once, to catch a slow GPU before the run.

Each server gets one round of `concurrency` chat completions of `max_tokens`; speed is the
completion tokens of the requests that finished within `budget_s`, divided by the time the
last of them finished. Small values make it cheap enough for rehearsals. Each server's own
limits (its resolved max_running_requests and KV pool, from /server_info) are recorded beside:
they bound the concurrency regen measures for it during the run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from regen.fleet.aio import run_coroutine
from regen.fleet.handle import Fleet
from regen.fleet.report import FleetRow, flag_slow
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeTarget
from regen.sglang_api.request import chat_request_body, request_id
from regen.sglang_api.server_info import server_limits

BENCH_MESSAGES = [{"role": "user", "content": "Explain how a hash map works, step by step."}]


async def _one(
    session: aiohttp.ClientSession, endpoint: Endpoint, target: ProbeTarget, max_tokens: int
) -> int:
    body = chat_request_body(
        target.served_name,
        BENCH_MESSAGES,
        target.sampling,
        rid=request_id("bench"),
        max_tokens=max_tokens,
    )
    async with session.post(endpoint.chat_url, json=body, headers=target.headers) as resp:
        resp.raise_for_status()
        answer = await resp.json(content_type=None)
    return int(answer["usage"]["completion_tokens"])


async def _server_info(
    session: aiohttp.ClientSession, endpoint: Endpoint, target: ProbeTarget
) -> dict[str, Any]:
    """The server's `/server_info` ({} when it cannot be read: the figures stay unknown)."""
    try:
        async with session.get(
            endpoint.url_of("/server_info"),
            headers=target.headers,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as resp:
            if resp.status != 200:
                return {}
            info = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _accept_length(info: dict[str, Any]) -> float | None:
    try:
        value = info["internal_states"][0].get("avg_spec_accept_length")
        return float(value) if value is not None else None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None


async def _bench_server(
    session: aiohttp.ClientSession,
    row: FleetRow,
    endpoint: Endpoint,
    target: ProbeTarget,
    concurrency: int,
    max_tokens: int,
    budget_s: float,
) -> FleetRow:
    start = time.monotonic()
    finished: list[float] = []

    async def timed() -> int:
        tokens = await _one(session, endpoint, target, max_tokens)
        finished.append(time.monotonic() - start)
        return tokens

    tasks = [asyncio.create_task(timed()) for _ in range(concurrency)]
    done, pending = await asyncio.wait(tasks, timeout=budget_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    ok = [t for t in done if t.exception() is None]
    info = await _server_info(session, endpoint, target)
    limits = server_limits(info)
    update: dict[str, object] = {
        "accept_length": _accept_length(info),
        "max_running_requests": limits.max_running_requests,
        "kv_tokens": limits.max_total_num_tokens,
    }
    if ok and finished:
        tokens = sum(t.result() for t in ok)
        update |= {"tok_s": round(tokens / max(finished), 1), "first_response_s": min(finished)}
    else:
        errors = {type(t.exception()).__name__ for t in done if t.exception() is not None}
        why = f"errors: {', '.join(sorted(errors))}" if errors else f"none within {budget_s:g} s"
        update["reason"] = f"micro-benchmark: no request finished ({why})"
    return row.model_copy(update=update)


async def _bench_all(
    fleet: Fleet, concurrency: int, max_tokens: int, budget_s: float
) -> list[FleetRow]:
    rows = {r.server: r for r in fleet.report}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await asyncio.gather(
            *(
                _bench_server(
                    session, rows[e.name], e, fleet.target, concurrency, max_tokens, budget_s
                )
                for e in fleet.endpoints
            )
        )


def benchmark_fleet(
    fleet: Fleet,
    concurrency: int = 32,
    max_tokens: int = 256,
    budget_s: float = 20.0,
    min_relative_speed: float = 0.5,
) -> list[FleetRow]:
    """Measure every healthy server concurrently, flag the slow ones, update `fleet.report`."""
    measured = run_coroutine(_bench_all(fleet, concurrency, max_tokens, budget_s))
    by_name = {r.server: r for r in measured}
    rows = [by_name.get(r.server, r) for r in fleet.report]
    rows = flag_slow(rows, min_relative_speed)
    fleet.update_report(rows)
    return rows
