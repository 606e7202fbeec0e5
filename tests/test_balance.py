"""Multi-node balance: starting ranges, the picking order, takeover of a dead node's shards,
lease keeping, node configs and the tally of what each node committed.

Everything runs on a real directory (LocalStorage); time is a fake clock where a lease
must run out, so no test waits out a lease except the LeaseKeeper one (a 0.6 s lease).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import regen.multinode.balance
from regen.config import RegenConfig, parse_config
from regen.dataset import commit_shard, manifested_shards, parse_manifest_key, read_manifest
from regen.errors import ConfigError
from regen.multinode.balance import ShardPicker
from regen.multinode.claims import ClaimLost, LeaseKeeper, ShardClaims, read_heartbeat
from regen.multinode.nodes import NodeConfig, NodeTally, check_nodes, heartbeat_age, split_ranges
from regen.rehearsal import bundled
from regen.schema import row_schema
from regen.storage import LocalStorage, Storage

FP = "balance-run"
PROMPT = '{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n'


class FakeClock:
    """A clock the test moves, so lease expiry is tested without sleeping."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rows(shard: int, n: int = 3, *, server: str = "server-0") -> pl.DataFrame:
    """`n` schema-valid completion rows of one shard."""
    data = [
        {
            "id": f"s{shard:04d}-{i}",
            "shard": shard,
            "messages": [{"role": "user", "content": f"question {shard}/{i}"}],
            "content": "The answer.",
            "reasoning_content": "Some reasoning here.",
            "finish_reason": "stop",
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "reasoning_tokens": 3,
            "model": "m",
            "server": server,
            "attempts": 1,
            "latency_s": 0.1,
            "error": None,
        }
        for i in range(n)
    ]
    return pl.DataFrame(data, schema=row_schema())


def picker(
    storage: Storage,
    node: str,
    ranges: dict[str, list[int]],
    weights: dict[str, float] | None = None,
    *,
    clock: FakeClock | None = None,
    lease_s: float = 60.0,
) -> ShardPicker:
    claims = ShardClaims(storage, node, lease_s=lease_s, clock=clock or time.time)
    return ShardPicker(claims, ranges, weights or dict.fromkeys(ranges, 1.0), FP)


def drain(p: ShardPicker) -> list[int]:
    """Every shard the picker hands out now, in order (each stays claimed and in hand)."""
    out: list[int] = []
    while (shard := p.next()) is not None:
        out.append(shard)
        assert len(out) < 1000, "next() never ran dry"
    return out


def holder(claims: ShardClaims, shard: int) -> str | None:
    """The node holding a live lease on the shard, or None: what a racer reading it sees."""
    claim = claims.latest(shard)
    live = claim is not None and claim.holder is not None and claim.expires_at > claims.clock()
    return claim.holder.node if live else None  # type: ignore[union-attr]


def claim_keys(storage: Storage, shard: int) -> list[str]:
    return storage.list(f"claims/shard-{shard:06d}.")


# --- split_ranges ------------------------------------------------------------------------------


def test_split_ranges_is_contiguous_disjoint_and_by_weight() -> None:
    pending = list(range(100, 130))
    ranges = split_ranges(pending, {"a": 2.0, "b": 1.0})
    assert list(ranges) == ["a", "b"]
    assert ranges["a"] == list(range(100, 120))
    assert ranges["b"] == list(range(120, 130))

    # Gaps in pending (committed shards) are skipped; three nodes cover everything once.
    pending = [s for s in range(50) if s % 7 != 3]
    weights = {"x": 7.0, "y": 4.0, "z": 1.0}
    ranges = split_ranges(pending, weights)
    joined = [s for r in ranges.values() for s in r]
    assert joined == pending, "ranges are contiguous, in node order, and cover all pending"
    assert len(set(joined)) == len(joined)
    total = sum(weights.values())
    for name, weight in weights.items():
        assert abs(len(ranges[name]) - len(pending) * weight / total) <= 1

    tiny = split_ranges(list(range(10)), {"big": 1000.0, "tiny": 0.001})
    assert tiny == {"big": list(range(10)), "tiny": []}
    assert split_ranges([], {"a": 1.0, "b": 1.0}) == {"a": [], "b": []}


# --- picking order -----------------------------------------------------------------------------


def test_own_range_front_to_back_then_back_of_the_other_range(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    ranges = split_ranges(list(range(10)), {"a": 1.0, "b": 1.0})
    a = picker(storage, "a", ranges)
    assert [a.next() for _ in range(5)] == [0, 1, 2, 3, 4]
    # b has not started: a takes b's shards from the back, where b would reach them last.
    assert [a.next() for _ in range(2)] == [9, 8]
    b = picker(storage, "b", ranges)
    assert [b.next() for _ in range(3)] == [5, 6, 7]
    assert a.next() is None and b.next() is None
    assert all(holder(a.claims, s) == "a" for s in [0, 1, 2, 3, 4, 8, 9])
    assert all(holder(a.claims, s) == "b" for s in [5, 6, 7])


def test_steals_from_the_node_with_most_unstarted_work_per_weight(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    ranges = {"a": [0, 1], "b": [2, 3, 4, 5], "c": [6, 7, 8, 9, 10, 11, 12, 13]}
    # c has twice b's shards but four times its weight: b is further behind.
    weights = {"a": 1.0, "b": 1.0, "c": 4.0}
    a = picker(storage, "a", ranges, weights)
    assert [a.next(), a.next()] == [0, 1]
    assert a.next() == 5  # b: 4 left / 1 > c: 8 / 4
    assert a.next() == 4  # b: 3 / 1 > 2
    assert a.next() == 3  # b: 2 / 1 == c: 2 -> first of equals, b
    assert a.next() == 13  # c: 8 / 4 = 2 > b: 1
    # With equal weights the longer unstarted range is the one stolen from.
    storage2 = LocalStorage(tmp_path / "equal")
    a2 = picker(storage2, "a", ranges)
    assert drain(a2)[:4] == [0, 1, 13, 12]


def test_started_shards_of_other_nodes_are_not_stolen_as_unstarted(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    ranges = {"a": [0], "b": [1, 2, 3, 4]}
    b = picker(storage, "b", ranges)
    assert b.next() == 1
    b.claims.claim(4)  # b (or a third node) started 4 by hand: it is not unstarted any more
    a = picker(storage, "a", ranges)
    assert drain(a) == [0, 3, 2]


# --- two nodes at different speeds -------------------------------------------------------------


def test_two_nodes_commit_every_shard_once_and_the_fast_one_does_more(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    num_shards = 60
    ranges = split_ranges(list(range(num_shards)), {"a": 1.0, "b": 1.0})
    committed: dict[int, list[str]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(node: str, delay_s: float) -> None:
        try:
            p = picker(storage, node, ranges)
            start.wait()
            while True:
                shard = p.next()
                if shard is None:
                    if not p.outstanding():
                        return
                    time.sleep(0.001)
                    continue
                time.sleep(delay_s)  # "generating"
                assert p.claims.owns(shard, margin_s=1.0)
                commit_shard(storage, shard, rows(shard), fingerprint=FP, timings={}, node=node)
                with lock:
                    committed.setdefault(shard, []).append(node)
                p.finish(shard, failed=False)
                p.claims.release(shard)
        except BaseException as err:  # surfaced in the main thread
            errors.append(err)

    threads = [
        threading.Thread(target=work, args=("a", 0.001)),
        # A commit (parquet + fsync) and a pick cost ~25 ms here, so b's "generation" must be
        # well above that for the speed difference not to drown in the commit's own jitter.
        threading.Thread(target=work, args=("b", 0.025)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    assert not any(t.is_alive() for t in threads), "a picker loop never ended"
    assert not errors, errors

    assert sorted(committed) == list(range(num_shards))
    twice = {s: n for s, n in committed.items() if len(n) != 1}
    assert not twice, f"committed more than once: {twice}"
    assert manifested_shards(storage) == set(range(num_shards))
    for shard, (node,) in committed.items():
        manifest = read_manifest(storage, shard)
        assert manifest is not None and manifest.node == node and manifest.rows == 3
    count = {n: sum(1 for v in committed.values() if v == [n]) for n in "ab"}
    assert count["a"] > count["b"], count
    assert count["a"] > num_shards // 2, "the fast node took some of the slow node's range"


# --- a dead node -------------------------------------------------------------------------------


def test_dead_nodes_shards_are_taken_over_after_the_lease(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    clock = FakeClock()
    ranges = split_ranges(list(range(10)), {"a": 1.0, "b": 1.0})
    b = picker(storage, "b", ranges, clock=clock, lease_s=30)
    assert [b.next() for _ in range(3)] == [5, 6, 7]  # then b dies holding them

    a = picker(storage, "a", ranges, clock=clock, lease_s=30)
    assert drain(a) == [0, 1, 2, 3, 4, 9, 8]
    assert a.outstanding() == [5, 6, 7], "b's live claims are others' work"
    for shard in [0, 1, 2, 3, 4, 9, 8]:
        commit_shard(storage, shard, rows(shard), fingerprint=FP, timings={}, node="a")
        a.finish(shard, failed=False)
        a.claims.release(shard)
    assert a.next() is None
    assert a.outstanding() == [5, 6, 7]

    clock.now += 29
    assert a.next() is None, "the lease has a second left"
    clock.now += 2
    assert drain(a) == [5, 6, 7]
    assert a.outstanding() == []
    assert all(holder(a.claims, s) == "a" for s in [5, 6, 7])
    # b, if it comes back, finds out at its fence and its renewal.
    assert not b.claims.owns(5)
    with pytest.raises(ClaimLost):
        b.claims.renew(5)


# --- a shard committed meanwhile --------------------------------------------------------------


def test_a_claimed_shard_with_a_manifest_is_handed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage(tmp_path)
    ranges = {"a": [0, 1], "b": [2]}
    b = picker(storage, "b", ranges)
    assert b.next() == 2
    commit_shard(storage, 2, rows(2), fingerprint=FP, timings={}, node="b")
    b.finish(2, failed=False)
    b.claims.release(2)

    # From a fresh listing, a never even tries the committed shard.
    a = picker(storage, "a", ranges)
    keys_before = claim_keys(storage, 2)
    assert drain(a) == [0, 1]
    assert claim_keys(storage, 2) == keys_before

    # A stale listing (b committed between a's listing and its claim): a claims 2, reads its
    # manifest, and hands it back at once.
    storage2 = LocalStorage(tmp_path / "race")
    b2 = picker(storage2, "b", ranges)
    assert b2.next() == 2
    commit_shard(storage2, 2, rows(2), fingerprint=FP, timings={}, node="b")
    b2.claims.release(2)
    a2 = picker(storage2, "a", {"a": [2], "b": []})
    monkeypatch.setattr(regen.multinode.balance, "manifested_shards", lambda storage: set())
    generation = a2.claims.latest(2)
    assert generation is not None and generation.holder is None
    assert a2.next() is None
    latest = a2.claims.latest(2)
    assert latest is not None
    assert latest.generation == generation.generation + 2, "claimed, then released again"
    assert latest.holder is None and holder(a2.claims, 2) is None
    assert 2 not in a2.mine

    # A manifest of another run (another fingerprint) does not count as committed.
    storage3 = LocalStorage(tmp_path / "other")
    commit_shard(storage3, 0, rows(0), fingerprint="older-run", timings={})
    a3 = picker(storage3, "a", {"a": [0]})
    assert a3.next() == 0


# --- giving a shard up -------------------------------------------------------------------------


def test_failed_shard_is_given_up_here_and_free_for_others(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    ranges = {"a": [0, 1, 2], "b": [3]}
    a = picker(storage, "a", ranges)
    assert a.next() == 0
    a.finish(0, failed=True)
    assert holder(a.claims, 0) is None, "failing releases the claim"
    assert 0 not in a.outstanding()
    assert drain(a) == [1, 2, 3]
    assert 0 not in a.outstanding()
    for shard in [1, 2, 3]:
        commit_shard(storage, shard, rows(shard), fingerprint=FP, timings={}, node="a")
        a.finish(shard, failed=False)
        a.claims.release(shard)
    assert a.next() is None
    assert a.outstanding() == []

    b = picker(storage, "b", ranges)
    assert b.outstanding() == [0]
    assert b.next() == 0
    assert holder(b.claims, 0) == "b"
    assert a.next() is None


# --- LeaseKeeper -------------------------------------------------------------------------------


def _until(done: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Wait on state; the timeout only guards against a hang."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _generation(claims: ShardClaims, shard: int) -> int:
    latest = claims.latest(shard)
    return -1 if latest is None else latest.generation


def test_lease_keeper_keeps_a_claim_and_notices_a_takeover(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    lease_s = 0.6
    claims = ShardClaims(storage, "a", lease_s=lease_s)
    assert claims.claim(7)
    assert claims.claim(8)
    first = claims.latest(7)
    assert first is not None
    with LeaseKeeper(claims, {"host": "gpu-1"}) as keeper:
        keeper.hold(7)
        keeper.hold(8)
        beat = read_heartbeat(storage, "a")
        assert beat is not None and beat["node"] == "a" and beat["host"] == "gpu-1"
        assert "done" not in beat
        # Until four renewals past the first claim: three lease lengths when the machine is
        # quick, longer when it is not; the claims must hold all the while.
        _until(lambda: _generation(claims, 7) >= first.generation + 4, "four renewals")
        assert claims.owns(7) and claims.owns(8), "renewed past three lease lengths"
        assert not keeper.lost(7)
        assert len(claim_keys(storage, 7)) <= 3
        assert len(claim_keys(storage, 8)) <= 3
        renewed = read_heartbeat(storage, "a")
        assert renewed is not None and renewed["held"] == [7, 8]
        assert renewed["at"] != beat["at"], "the heartbeat beat with the renewals"
        age = heartbeat_age(storage, "a", time.time())
        assert age is not None and age >= 0

        # b's clock runs ahead: a's lease looks expired to b, which takes the shard over.
        b = ShardClaims(storage, "b", lease_s=60, clock=lambda: time.time() + 10)
        # A renewal racing b's claim wins that generation; b simply tries again.
        assert any(b.claim(7) for _ in range(5))
        _until(lambda: keeper.lost(7), "the keeper to notice the takeover")
        assert not keeper.lost(8)
        assert not claims.owns(7) and claims.owns(8)
        assert holder(b, 7) == "b", "the keeper's renewals never overwrite b's claim"
        _until(lambda: (read_heartbeat(storage, "a") or {}).get("held") == [8], "held == [8]")
        keeper.drop(8)
    beat = read_heartbeat(storage, "a")
    assert beat is not None and beat["done"] == "true"
    assert heartbeat_age(storage, "a", time.time()) is None
    assert len(claim_keys(storage, 7)) <= 3 and len(claim_keys(storage, 8)) <= 3


# --- NodeConfig / check_nodes ------------------------------------------------------------------


def run_config(tmp_path: Path, **engine: Any) -> RegenConfig:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(PROMPT)
    data: dict[str, Any] = {
        "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp_path / "out"),
        "engine": {
            "kind": "emulator",
            "gpus": [0],
            "base_port": 31000,
            "emulator": {"time_scale": 0.1},
            **engine,
        },
    }
    return parse_config(data, "test")


def test_node_config_data_merges_overrides_and_passes_only_what_was_set(tmp_path: Path) -> None:
    run = run_config(tmp_path, api_key="sk-very-secret")
    assert run.engine.api_key is not None
    node = NodeConfig(
        name="b",
        engine={"gpus": [0, 1], "emulator": {"seed": 5}},
        work_dir=str(tmp_path / "work-b"),
        stage_dir="/scratch/b",
        concurrency_per_server=8,
    )
    data = node.config_data(run)
    engine = data["engine"]
    assert engine["gpus"] == [0, 1]
    assert engine["emulator"] == {"time_scale": 0.1, "seed": 5}, "merged, not replaced"
    assert engine["kind"] == "emulator" and engine["base_port"] == 31000
    assert "python" not in engine, "the interpreter default resolves on the node"
    assert "max_running_requests" not in engine and "sampling" not in data
    assert "api_key" not in engine
    assert "sk-very-secret" not in repr(data)
    assert data["work_dir"] == str(tmp_path / "work-b")
    assert data["model"]["stage_dir"] == "/scratch/b"
    assert data["model"]["served_name"] == "m"
    assert data["concurrency_per_server"] == 8
    # The run's own config is untouched by the merge.
    assert run.engine.gpus == [0] and run.engine.emulator.seed == 0
    assert run.engine.api_key is not None

    parsed = parse_config(data, "node")
    assert parsed.engine.num_servers == 2
    assert parsed.engine.emulator.time_scale == 0.1 and parsed.engine.emulator.seed == 5

    plain = NodeConfig(name="a").config_data(run)
    assert plain["engine"]["gpus"] == [0] and "api_key" not in plain["engine"]
    assert "work_dir" not in plain and "concurrency_per_server" not in plain


def test_check_nodes_names_the_bad_node_and_key(tmp_path: Path) -> None:
    run = run_config(tmp_path)
    good = NodeConfig(name="a", engine={"gpus": [0, 1, 2]})
    configs = check_nodes(run, [good, NodeConfig(name="b")])
    assert configs["a"].engine.num_servers == 3 and configs["b"].engine.num_servers == 1

    bad = NodeConfig(name="b", engine={"emulator": {"time_scal": 1.0}})
    with pytest.raises(ConfigError) as err:
        check_nodes(run, [good, bad])
    assert "nodes[1] (b)" in str(err.value)
    assert "engine.emulator.time_scal" in str(err.value)
    assert "nodes[0]" not in str(err.value)

    with pytest.raises(ConfigError, match="gpus"):
        check_nodes(run, [NodeConfig(name="c", engine={"gpus": [1, 1]})])

    with pytest.raises(ConfigError, match="appears twice") as err:
        check_nodes(run, [good, NodeConfig(name="b"), NodeConfig(name="a")])
    assert "'a'" in str(err.value)

    with pytest.raises(ConfigError, match="at least one node"):
        check_nodes(run, [])


# --- NodeTally ---------------------------------------------------------------------------------


def test_node_tally_reads_incrementally_and_groups_by_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage(tmp_path)
    commit_shard(storage, 0, rows(0, 3), fingerprint=FP, timings={}, node="a")
    commit_shard(storage, 1, rows(1, 4), fingerprint=FP, timings={}, node="a")
    commit_shard(storage, 2, rows(2, 5), fingerprint=FP, timings={}, node="b")
    commit_shard(storage, 3, rows(3, 9), fingerprint="another-run", timings={}, node="a")

    read: list[int] = []  # the shards whose manifest the tally read
    real_read = storage.read_bytes

    def counting(key: str) -> bytes:
        if (shard := parse_manifest_key(key)) is not None:
            read.append(shard)
        return real_read(key)

    monkeypatch.setattr(storage, "read_bytes", counting)

    tally = NodeTally(storage, FP, num_shards=5)
    assert tally.rows == 0 and tally.by_node() == {} and not tally.complete
    assert tally.refresh() is tally
    assert tally.rows == 12
    assert tally.by_node() == {"a": (2, 7), "b": (1, 5)}
    assert sorted(tally.manifests) == [0, 1, 2]
    assert not tally.complete

    read.clear()
    commit_shard(storage, 4, rows(4, 2), fingerprint=FP, timings={})  # a single-node shard
    tally.refresh()
    assert not {0, 1, 2} & set(read), "a tallied manifest is read once"
    assert 4 in read
    assert tally.rows == 14
    assert tally.by_node() == {"a": (2, 7), "b": (1, 5), "": (1, 2)}
    assert not tally.complete, "shard 3 is another run's"

    commit_shard(storage, 3, rows(3, 1), fingerprint=FP, timings={}, node="b")
    tally.refresh()
    assert tally.complete
    assert tally.rows == 15
    assert tally.by_node() == {"a": (2, 7), "b": (2, 6), "": (1, 2)}
