"""A server's own limits, read from its `/server_info` as SGLang 0.5.23 reports them.

`max_total_num_tokens` (the KV pool, from the scheduler's init info, merged in at the top by
utils/common.build_server_info) and `internal_states[i].effective_max_running_requests_per_dp`
(the running cap the scheduler resolved: the flag capped at half the pool, or its own sizing;
one state per data-parallel rank). The top-level `max_running_requests` is only the launch
flag as resolved before the scheduler starts (None when SGLang sizes it), so it comes last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What a server can hold at once; None where the server did not say."""

    max_running_requests: int | None
    max_total_num_tokens: int | None


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 else None


def server_limits(info: dict[str, Any]) -> ServerLimits:
    """The limits in a `/server_info` body; never raises on an odd or partial one."""
    states = info.get("internal_states")
    states = [s for s in states if isinstance(s, dict)] if isinstance(states, list) else []
    per_rank = [_positive_int(s.get("effective_max_running_requests_per_dp")) for s in states]
    running = sum(r for r in per_rank if r) or _positive_int(info.get("max_running_requests"))
    tokens = _positive_int(info.get("max_total_num_tokens"))
    if tokens is None and states:
        usage = states[0].get("memory_usage")
        tokens = _positive_int(usage.get("token_capacity")) if isinstance(usage, dict) else None
    return ServerLimits(max_running_requests=running or None, max_total_num_tokens=tokens)
