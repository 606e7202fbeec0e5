"""The multi-node claim loop (`regen.multinode.loop.run_claimed`) without Prefect.

Several "nodes" are threads on one LocalStorage root, each with its own claims, lease keeper
and a thread pool standing in for the flow's task runner; shards go through the real
generate-and-commit (`regen.generation.shard.generate_shard`) with an in-process row source
in place of the fleet. What matters: every shard is committed exactly once, a fast node does
more, a node that stops renewing (cut off from storage) loses its shards to the others and
commits nothing when it comes back, a failed shard does not stop the rest, and a fleet that is
gone stops its node (or run) at once, its shards left to the others.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent import futures
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from regen.config import parse_config
from regen.dataset import manifested_shards, read_manifest
from regen.errors import FleetGone, FleetUnauthorized, UserError
from regen.generation.loop import NodeResult, run_all
from regen.generation.outcome import ShardOutcome, summarize
from regen.generation.run_plan import RunPlan, plan_run
from regen.generation.shard import Commit, Fence, generate_shard, stops_run, worth_retrying
from regen.multinode.claims import ShardClaims
from regen.multinode.loop import run_claimed
from regen.multinode.nodes import NodeAssignment, split_ranges
from regen.rehearsal import bundled
from regen.storage import LocalStorage, Storage

NUM_SHARDS = 12
SHARD_SIZE = 3


class Model:
    """Answers every prompt after `delay_s`; `gate` (if set) holds answers until it opens,
    and `fail` names shards whose answers raise."""

    def __init__(
        self,
        delay_s: float = 0.0,
        gate: threading.Event | None = None,
        fail: frozenset[int] = frozenset(),
    ) -> None:
        self.delay_s, self.gate, self.fail = delay_s, gate, fail
        self.pool = futures.ThreadPoolExecutor(8)
        self.received: list[int] = []

    def submit_shard(self, shard: int, rows: pl.DataFrame) -> futures.Future[pl.DataFrame]:
        self.received.append(shard)
        return self.pool.submit(self._answer, shard, rows)

    def _answer(self, shard: int, rows: pl.DataFrame) -> pl.DataFrame:
        if self.gate is not None:
            assert self.gate.wait(30), "gate never opened"
        time.sleep(self.delay_s)
        if shard in self.fail:
            raise RuntimeError(f"shard {shard}: the model fell over")
        return rows.select(
            "id",
            "shard",
            pl.lit(None).alias("messages"),
            pl.lit(None, pl.String).alias("tools"),
            pl.format("answer to {}", "id").alias("content"),
            pl.lit("thinking").alias("reasoning_content"),
            pl.lit("stop").alias("finish_reason"),
            pl.lit(5).alias("prompt_tokens"),
            pl.lit(7).alias("completion_tokens"),
            pl.lit(2).alias("reasoning_tokens"),
            pl.lit("m").alias("model"),
            pl.lit("server-0").alias("server"),
            pl.lit(1).alias("attempts"),
            pl.lit(0.01).alias("latency_s"),
            pl.lit(None, pl.String).alias("error"),
            pl.lit(None).alias("turns"),
            pl.lit(None).alias("sampling"),
        )


class Partitioned(LocalStorage):
    """A node's view of the shared root that can be cut off: every call fails while `cut`."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.cut = threading.Event()

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if callable(attr) and not name.startswith("_") and super().__getattribute__("cut").is_set():
            raise OSError(f"{name}: storage unreachable")
        return attr


def plan(tmp_path: Path) -> RunPlan:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            f'{{"id": "p{i:03d}", "messages": [{{"role": "user", "content": "q {i}"}}]}}\n'
            for i in range(NUM_SHARDS * SHARD_SIZE)
        )
    )
    data: dict[str, Any] = {
        "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp_path / "out"),
        "work_dir": str(tmp_path / "work"),
        "shard_size": SHARD_SIZE,
        "engine": {"kind": "emulator", "gpus": [0], "base_port": 31000},
    }
    config = parse_config(data, "test")
    return plan_run(config, LocalStorage(tmp_path / "out"))


class Node:
    """One node: its storage view, its model, a task pool, and what it committed."""

    def __init__(self, name: str, storage: Storage, model: Model, log: list[tuple[int, str]]):
        self.name, self.storage, self.model, self.log = name, storage, model, log
        self.pool = futures.ThreadPoolExecutor(4)
        self.result: NodeResult | None = None
        self.error: BaseException | None = None

    def run(self, plan: RunPlan, ranges: dict[str, list[int]], lease_s: float) -> None:
        assignment = NodeAssignment(
            name=self.name, ranges=ranges, weights=dict.fromkeys(ranges, 1.0), lease_s=lease_s
        )

        def committed(commit: Commit) -> None:
            self.log.append((commit.shard, self.name))
            assert commit.rows.height == commit.manifest.rows == SHARD_SIZE

        def submit(shard: int, lease: Fence | None) -> futures.Future[ShardOutcome]:
            return self.pool.submit(
                generate_shard, shard, plan, self.model, self.storage,
                lease=lease, on_commit=committed,
            )  # fmt: skip

        try:
            self.result = run_claimed(self.storage, assignment, plan.fingerprint, submit, window=2)
        except BaseException as err:  # surfaced in the test's thread
            self.error = err

    def start(self, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=args, name=f"node-{self.name}")
        thread.start()
        return thread


def test_nodes_share_the_shards_and_commit_each_exactly_once(tmp_path: Path) -> None:
    p = plan(tmp_path)
    root = tmp_path / "out"
    ranges = split_ranges(p.pending, {"a": 1.0, "b": 1.0, "c": 1.0})
    log: list[tuple[int, str]] = []
    nodes = [
        Node("a", LocalStorage(root), Model(0.0), log),
        Node("b", LocalStorage(root), Model(0.0), log),
        Node("c", LocalStorage(root), Model(0.4), log),  # slow: the others take its range
    ]
    threads = [n.start(p, ranges, 2.0) for n in nodes]
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a node never stopped"
    assert [n.error for n in nodes] == [None, None, None]

    counts = Counter(shard for shard, _ in log)
    assert sorted(counts) == list(range(NUM_SHARDS))
    assert set(counts.values()) == {1}, f"committed more than once: {counts}"
    assert manifested_shards(LocalStorage(root)) == set(range(NUM_SHARDS))
    by_node = dict(log)
    for shard, node in by_node.items():
        manifest = read_manifest(LocalStorage(root), shard)
        assert manifest is not None and manifest.node == node
        assert manifest.fingerprint == p.fingerprint and manifest.ok == SHARD_SIZE
    results = {n.name: n.result for n in nodes}
    assert all(r is not None and not r.failures for r in results.values())
    outcomes = {o.shard for r in results.values() if r for o in r.outcomes}
    assert outcomes == set(range(NUM_SHARDS))
    done = Counter(by_node.values())
    assert done["c"] < len(ranges["c"]), f"the fast nodes took none of c's range: {done}"


def test_a_node_that_stops_renewing_loses_its_shards_and_commits_nothing(
    tmp_path: Path,
) -> None:
    p = plan(tmp_path)
    root = tmp_path / "out"
    ranges = split_ranges(p.pending, {"a": 1.0, "b": 1.0})
    log: list[tuple[int, str]] = []
    gate = threading.Event()
    b_storage = Partitioned(root)
    b = Node("b", b_storage, Model(gate=gate), log)
    lease_s = 1.5
    b_thread = b.start(p, ranges, lease_s)
    deadline = time.monotonic() + 10
    while len(b.model.received) < 2:  # both shards claimed, read and sent: b is generating
        assert time.monotonic() < deadline, "b never started its shards"
        time.sleep(0.02)
    held = sorted({int(k.split("shard-")[1][:6]) for k in LocalStorage(root).list("claims/")})
    assert held == sorted(b.model.received) == ranges["b"][:2]
    b_storage.cut.set()  # b's machine drops off the network: no renewals, no heartbeat

    a = Node("a", LocalStorage(root), Model(), log)
    start = time.monotonic()
    a.run(p, ranges, lease_s)
    assert a.error is None and a.result is not None
    assert time.monotonic() - start >= lease_s * 0.5, "b's live leases were waited out"
    assert sorted(o.shard for o in a.result.outcomes) == list(range(NUM_SHARDS))

    b_storage.cut.clear()  # b comes back and finishes what it was generating
    gate.set()
    b_thread.join(timeout=30)
    assert not b_thread.is_alive()
    assert b.error is None and b.result is not None
    assert b.result.outcomes == [] and b.result.failures == []
    counts = Counter(shard for shard, _ in log)
    assert set(counts.values()) == {1} and sorted(counts) == list(range(NUM_SHARDS))
    assert {node for _, node in log} == {"a"}
    for shard in held:
        manifest = read_manifest(LocalStorage(root), shard)
        assert manifest is not None and manifest.node == "a"


def test_stop_claims_nothing_more_and_lets_running_shards_finish(tmp_path: Path) -> None:
    p = plan(tmp_path)
    root = tmp_path / "out"
    node = NodeAssignment(name="a", ranges={"a": p.pending}, weights={"a": 1.0}, lease_s=30)
    model, pool = Model(0.05), futures.ThreadPoolExecutor(4)
    seen: list[int] = []

    def submit(shard: int, lease: Fence | None) -> futures.Future[ShardOutcome]:
        return pool.submit(generate_shard, shard, p, model, LocalStorage(root), lease=lease)

    result = run_claimed(
        LocalStorage(root), node, p.fingerprint, submit, window=2,
        on_outcome=lambda o: seen.append(o.shard), stop=lambda: len(seen) >= 1,
    )  # fmt: skip
    committed = manifested_shards(LocalStorage(root))
    assert 1 <= len(committed) <= 3, "at most the window ran past the stop"
    assert committed == {o.shard for o in result.outcomes} == set(seen)
    claims = LocalStorage(root).list("claims/")
    assert all(f"shard-{s:06d}" not in k for k in claims for s in range(NUM_SHARDS) if s > 3)


def test_run_all_commits_the_others_when_one_shard_fails(tmp_path: Path) -> None:
    p = plan(tmp_path)
    storage = LocalStorage(tmp_path / "out")
    model, pool = Model(fail=frozenset({4})), futures.ThreadPoolExecutor(4)

    def submit(shard: int, lease: Fence | None) -> futures.Future[ShardOutcome]:
        assert lease is None
        return pool.submit(generate_shard, shard, p, model, storage)

    start = time.monotonic()
    result = run_all(p.pending, submit, window=4)
    assert [o.shard for o in result.outcomes] == [s for s in range(NUM_SHARDS) if s != 4]
    assert (
        len(result.failures) == 1
        and "shard 000004: shard 4: the model fell" in (result.failures[0])
    )
    assert manifested_shards(storage) == set(range(NUM_SHARDS)) - {4}
    with pytest.raises(UserError, match=r"1 shard\(s\) failed: shard 000004"):
        summarize(result.outcomes, result.failures, start)
    ok = summarize(result.outcomes, [], start)
    assert ok.shards_generated == NUM_SHARDS - 1
    assert ok.rows == ok.ok == (NUM_SHARDS - 1) * SHARD_SIZE
    assert ok.completion_tokens == 7 * ok.rows


def test_run_all_starts_no_shard_once_stopped(tmp_path: Path) -> None:
    p = plan(tmp_path)
    storage = LocalStorage(tmp_path / "out")
    model, pool = Model(), futures.ThreadPoolExecutor(4)
    started: list[int] = []

    def submit(shard: int, lease: Fence | None) -> futures.Future[ShardOutcome]:
        started.append(shard)
        return pool.submit(generate_shard, shard, p, model, storage)

    result = run_all(p.pending, submit, window=2, stop=lambda: len(started) >= 3)
    assert started == [0, 1, 2], "a window of 2: the third starts as one ends, then none"
    assert sorted(o.shard for o in result.outcomes) == [0, 1, 2] and not result.failures
    assert manifested_shards(storage) == {0, 1, 2}


class GoneFleet(Model):
    """A fleet that is gone: every answer raises what the dispatcher raises then."""

    def _answer(self, shard: int, rows: pl.DataFrame) -> pl.DataFrame:
        raise FleetGone("server-0 exited at 03:27:27 (SIGKILL); no server can come back")


def test_run_all_starts_no_shard_once_the_fleet_is_gone_and_says_it_once(
    tmp_path: Path,
) -> None:
    """Before, each later shard was submitted and failed alike: 57 failures for one cause."""
    p = plan(tmp_path)
    storage = LocalStorage(tmp_path / "out")
    model, pool = GoneFleet(), futures.ThreadPoolExecutor(4)
    started: list[int] = []

    def submit(shard: int, lease: Fence | None) -> futures.Future[ShardOutcome]:
        started.append(shard)
        return pool.submit(generate_shard, shard, p, model, storage)

    result = run_all(p.pending, submit, window=3)
    assert started == [0, 1, 2], "a shard started after the fleet was gone"
    assert isinstance(result.fatal, FleetGone) and result.failures == []
    assert result.outcomes == [] and manifested_shards(storage) == set()
    assert stops_run(result.fatal) and not worth_retrying(result.fatal)
    assert stops_run(FleetUnauthorized("server-0 answered 401: the API key is wrong"))
    assert not stops_run(RuntimeError("a storage hiccup"))


def test_a_node_whose_fleet_is_gone_stops_alone_and_leaves_its_shards_to_the_others(
    tmp_path: Path,
) -> None:
    p = plan(tmp_path)
    root = tmp_path / "out"
    ranges = split_ranges(p.pending, {"a": 1.0, "b": 1.0})
    log: list[tuple[int, str]] = []
    # A lease far longer than the test: a shard `a` kept hold of would stall `b` visibly.
    lease_s = 600.0
    a = Node("a", LocalStorage(root), GoneFleet(), log)
    a.run(p, ranges, lease_s)
    assert a.error is None and a.result is not None
    assert isinstance(a.result.fatal, FleetGone) and a.result.failures == []
    tried = sorted(set(a.model.received))
    assert tried == ranges["a"][:2], "a claimed past its first window once its fleet was gone"
    claims = ShardClaims(LocalStorage(root), "b", lease_s)
    for shard in tried:
        latest = claims.latest(shard)
        assert latest is not None and latest.holder is None, f"a kept its claim on {shard}"
    assert manifested_shards(LocalStorage(root)) == set()

    b = Node("b", LocalStorage(root), Model(), log)
    b.run(p, ranges, lease_s)
    assert b.error is None and b.result is not None and b.result.fatal is None
    counts = Counter(shard for shard, _ in log)
    assert sorted(counts) == list(range(NUM_SHARDS)) and set(counts.values()) == {1}
    assert {node for _, node in log} == {"b"}
