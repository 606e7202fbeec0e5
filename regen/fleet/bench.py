"""A short fixed load on every healthy server at once, to catch a slow GPU before the run.

Each server gets one round of `concurrency` chat completions of `max_tokens`; speed is the
completion tokens of the requests that finished within `budget_s`, divided by the time the
last of them finished. Small values make it cheap enough for rehearsals.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from regen.fleet.aio import run_coroutine
from regen.fleet.handle import Fleet
from regen.fleet.report import FleetRow, flag_slow
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeTarget
from regen.sglang_api.request import chat_request_body, request_id

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


async def _accept_length(
    session: aiohttp.ClientSession, endpoint: Endpoint, target: ProbeTarget
) -> float | None:
    try:
        async with session.get(
            endpoint.url_of("/server_info"),
            headers=target.headers,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as resp:
            if resp.status != 200:
                return None
            info = await resp.json(content_type=None)
        value = info["internal_states"][0].get("avg_spec_accept_length")
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, TypeError, ValueError):
        return None
    return float(value) if value is not None else None


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
    update: dict[str, object] = {"accept_length": await _accept_length(session, endpoint, target)}
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
