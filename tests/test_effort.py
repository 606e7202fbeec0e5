"""`reasoning_effort` picks: stable per id and turn, and in the shares asked for."""

from __future__ import annotations

from collections import Counter

import pytest

from regen.client.effort import pick_effort
from regen.config import RegenerationConfig

SHARES = {"low": 0.4, "medium": 0.4, "high": 0.2}


def test_no_shares_sends_no_effort() -> None:
    assert pick_effort({}, "a") is None


def test_the_same_id_and_turn_always_get_the_same_effort() -> None:
    picks = [pick_effort(SHARES, f"id-{i}", turn) for i in range(200) for turn in (1, 2)]
    again = [
        pick_effort(dict(reversed(SHARES.items())), f"id-{i}", t)
        for i in range(200)
        for t in (1, 2)
    ]
    assert picks == again
    # Turns of one conversation are drawn independently: not every turn copies turn 1.
    assert any(picks[2 * i] != picks[2 * i + 1] for i in range(200))


def test_the_mix_follows_the_shares() -> None:
    counts = Counter(pick_effort(SHARES, f"s{i}") for i in range(20_000))
    for effort, share in SHARES.items():
        assert counts[effort] / 20_000 == pytest.approx(share, abs=0.015)


def test_a_zero_share_is_never_picked() -> None:
    shares = {"low": 0.0, "high": 1.0}
    assert {pick_effort(shares, f"s{i}") for i in range(500)} == {"high"}


@pytest.mark.parametrize("shares", [{"low": 0.5}, {"low": 1.2, "high": -0.2}])
def test_shares_must_be_a_distribution(shares: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="shares"):
        RegenerationConfig(reasoning_effort=shares)
