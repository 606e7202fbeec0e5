"""Shard claims on a real directory and a real S3 API (moto on loopback): races have one winner."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from regen.multinode.claims import ClaimLost, ShardClaims
from regen.storage import LocalStorage, Storage
from support.s3 import MotoS3


class FakeClock:
    """A clock the test moves, so lease expiry is tested without sleeping."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    moto: MotoS3 = request.getfixturevalue("moto")
    return moto.storage(moto.create_bucket(), "runs/r1")


def _race(fns: list[Callable[[], bool]]) -> list[bool]:
    """Run the callables at once (a barrier lines them up) and return their results in order."""
    barrier = threading.Barrier(len(fns))

    def go(fn: Callable[[], bool]) -> bool:
        barrier.wait()
        return fn()

    with ThreadPoolExecutor(len(fns)) as pool:
        return list(pool.map(go, fns))


def holder(claims: ShardClaims, shard: int) -> str | None:
    """The node holding a live lease on the shard, or None: what a racer reading it sees."""
    claim = claims.latest(shard)
    live = claim is not None and claim.holder is not None and claim.expires_at > claims.clock()
    return claim.holder.node if live else None  # type: ignore[union-attr]


def _claimer(claims: ShardClaims, shard: int) -> Callable[[], bool]:
    return lambda: claims.claim(shard)


def test_create_exclusive_creates_once(storage: Storage) -> None:
    assert storage.create_exclusive("claims/x.json", b"first")
    assert not storage.create_exclusive("claims/x.json", b"second")
    assert storage.read_bytes("claims/x.json") == b"first"
    assert storage.list("claims/") == ["claims/x.json"]


def test_only_one_node_wins_a_claim(storage: Storage) -> None:
    a = ShardClaims(storage, "node-a", lease_s=60)
    b = ShardClaims(storage, "node-b", lease_s=60)
    assert a.claim(42)
    assert not b.claim(42)
    assert a.claim(42), "claiming again what one holds is idempotent"
    assert a.owns(42) and not b.owns(42)
    assert holder(a, 42) == holder(b, 42) == "node-a"
    assert storage.list("claims/")[0].startswith("claims/shard-000042.")
    with pytest.raises(ClaimLost):
        b.renew(42)


def test_racing_threads_claim_each_shard_exactly_once(storage: Storage) -> None:
    clock = FakeClock()
    nodes = [ShardClaims(storage, f"node-{i}", lease_s=60, clock=clock) for i in range(8)]
    won: dict[int, list[str]] = {shard: [] for shard in range(20)}
    lock = threading.Lock()

    def grab(node: ShardClaims) -> Callable[[], bool]:
        def run() -> bool:
            for shard in range(20):
                if node.claim(shard):
                    with lock:
                        won[shard].append(node.node)
            return True

        return run

    _race([grab(node) for node in nodes])
    assert all(len(winners) == 1 for winners in won.values()), won
    for shard, (winner,) in won.items():
        assert holder(nodes[0], shard) == winner


def test_expired_lease_is_taken_over_by_exactly_one(storage: Storage) -> None:
    clock = FakeClock()
    old = ShardClaims(storage, "old", lease_s=30, clock=clock)
    racers = [ShardClaims(storage, f"racer-{i}", lease_s=30, clock=clock) for i in range(2)]
    assert old.claim(7)
    old.renew(7)
    clock.now += 20
    assert not racers[0].claim(7), "a live lease is not taken over"
    clock.now += 11  # past the renewed expiry (renewed at t0 for 30 s)

    results = _race([_claimer(r, 7) for r in racers])
    assert sorted(results) == [False, True]
    winner = racers[results.index(True)]
    assert winner.owns(7) and holder(winner, 7) == winner.node
    assert not old.owns(7)
    with pytest.raises(ClaimLost):
        old.renew(7)
    old.release(7)  # not held: must not free the winner's claim
    assert winner.owns(7)


def test_renew_extends_and_release_frees(storage: Storage) -> None:
    clock = FakeClock()
    a = ShardClaims(storage, "a", lease_s=30, clock=clock)
    b = ShardClaims(storage, "b", lease_s=30, clock=clock)
    assert a.claim(3)
    clock.now += 25
    a.renew(3)
    clock.now += 25
    assert a.owns(3) and not b.claim(3), "renewal moved expiry past the first lease"
    clock.now += 10
    assert not a.owns(3), "an expired lease is not owned even before anyone takes it"
    a.renew(3)  # nobody took it over: renewing an expired lease of one's own is allowed
    a.release(3)
    assert holder(a, 3) is None and not a.owns(3)
    assert b.claim(3) and b.owns(3)


def test_renew_racing_takeover_has_one_winner(storage: Storage) -> None:
    clock = FakeClock()
    old = ShardClaims(storage, "old", lease_s=30, clock=clock)
    new = ShardClaims(storage, "new", lease_s=30, clock=clock)
    assert old.claim(9)
    clock.now += 31

    def renew() -> bool:
        try:
            old.renew(9)
        except ClaimLost:
            return False
        return True

    results = _race([renew, lambda: new.claim(9)])
    assert sorted(results) == [False, True]
    assert old.owns(9) == results[0] and new.owns(9) == results[1]
