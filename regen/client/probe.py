"""The default re-probe of a quarantined server: `/health`, then one real 1-token chat.

`/health` alone can answer 200 while the scheduler is stuck (sglang#6624), so a server
only comes back after it has generated something for us.
"""

from __future__ import annotations

import json

import aiohttp

from regen.client.request import chat_request_body
from regen.config import SamplingConfig
from regen.fleet.endpoint import Endpoint


async def probe_server(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    *,
    headers: dict[str, str],
    model: str,
    sampling: SamplingConfig,
    timeout_s: float,
) -> bool:
    """True when the server answers `/health` and a tiny chat, each within `timeout_s`."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    body = chat_request_body(
        model, [{"role": "user", "content": "ping"}], sampling, rid=None, max_tokens=1
    )
    try:
        async with session.get(f"{endpoint.url}/health", timeout=timeout) as resp:
            if resp.status != 200:
                return False
        async with session.post(
            f"{endpoint.url}/v1/chat/completions",
            data=json.dumps(body),
            headers=headers,
            timeout=timeout,
        ) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
