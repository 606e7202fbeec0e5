"""Which `reasoning_effort` a request gets, from the configured shares.

The pick is a hash of the sample id and turn, not a random draw: a retry, a resumed run or
another node sends the same effort for the same turn, so the mix in the dataset is the mix
asked for and a row can be regenerated to the same settings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TypeVar

# Generic so a config's `dict[ReasoningEffort, float]` goes in and its Literal comes back.
E = TypeVar("E", bound=str)


def pick_effort(shares: Mapping[E, float], sample_id: str, turn: int = 1) -> E | None:
    """An effort whose long-run frequency is its share; None when no shares are set."""
    if not shares:
        return None
    digest = hashlib.sha256(f"{sample_id}\x00{turn}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    cumulative = 0.0
    chosen: E | None = None
    for effort, share in sorted(shares.items()):
        if share <= 0:
            continue
        chosen = effort
        cumulative += share
        if point < cumulative:
            return effort
    return chosen  # rounding left the point just above the last cumulative share
