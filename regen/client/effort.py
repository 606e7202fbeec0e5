"""Which `reasoning_effort` a request gets, from the configured shares.

The pick is a hash of the sample id and turn, not a random draw: a retry, a resumed run or
another node sends the same effort for the same turn, so the mix in the dataset is the mix
asked for and a row can be regenerated to the same settings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

# Generic so a config's `dict[ReasoningEffort, float]` goes in and its Literal comes back.
E = TypeVar("E", bound=str)
K = TypeVar("K", bound="SupportsRichComparison")


def pick_effort(shares: Mapping[E, float], sample_id: str, turn: int = 1) -> E | None:
    """An effort whose long-run frequency is its share; None when no shares are set."""
    return pick_share(shares, f"{sample_id}\x00{turn}")


def pick_share(shares: Mapping[K, float], key: str) -> K | None:
    """The entry of `shares` that `key` hashes to, each as often as its share; None when no
    shares are set. Entries are taken in sorted order, so the dict's order changes nothing.
    Each kind of draw salts the key its own way (`<id>\\x00<turn>` for an effort,
    `<id>\\x00sampling` for a row's setting), so draws of one row are independent."""
    if not shares:
        return None
    digest = hashlib.sha256(key.encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    cumulative = 0.0
    chosen: K | None = None
    for entry, share in sorted(shares.items()):
        if share <= 0:
            continue
        chosen = entry
        cumulative += share
        if point < cumulative:
            return entry
    return chosen  # rounding left the point just above the last cumulative share
