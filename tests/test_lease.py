"""One lease protocol (regen.storage.lease) under the output's lease and the shard claims, on a
real directory and a real S3 API (moto on loopback).

They were two leases on the same generation files with their own rules: a claim expired by the
writer's clock and never by its holder's death, the output by its reader's lease and a dead
pid; a claim's fence refused a commit with less than a third of its lease left, even with
nobody else in sight, the output's fence looked at no clock at all; a claim read a pruned
record as a crash. Here each user meets the one rule. Holders are real processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from regen.dataset.keys import claim_key, lease_key
from regen.errors import UserError
from regen.multinode.claims import ShardClaims
from regen.storage import LocalStorage, Storage
from regen.storage.lease import Holder, LeaseRecord
from regen.storage.output_lease import OutputLease, check_held, read_lease
from support.s3 import MotoS3


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    moto: MotoS3 = request.getfixturevalue("moto")
    return moto.storage(moto.create_bucket(), "runs/r1")


@pytest.fixture
def other_process() -> Iterator[psutil.Process]:
    """A live process of this host that is not the test: another run's holder."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


class FakeClock:
    def __init__(self, now: float = 2_000_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_claim_whose_node_died_on_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    """The output's rule, now the claims' too: a node killed here (its pid and start time
    gone) holds nothing, with 60 s of its lease left. Before, the others waited them out."""
    root = tmp_path / "root"
    claim = (
        "import sys; from pathlib import Path; from regen.storage import LocalStorage; "
        "from regen.multinode.claims import ShardClaims; "
        "assert ShardClaims(LocalStorage(Path(sys.argv[1])), 'node-2', lease_s=60).claim(7)"
    )
    subprocess.run([sys.executable, "-c", claim, str(root)], check=True, timeout=60)
    mine = ShardClaims(LocalStorage(root), "node-1", lease_s=60)
    dead = mine.latest(7)
    assert dead is not None and dead.holder is not None and dead.holder.node == "node-2"
    assert dead.expires_at > time.time() + 30, "its lease has most of a minute left"
    assert "is gone" in (dead.why_dead(time.time()) or "")
    assert mine.claim(7) and mine.owns(7)


def test_a_live_claim_elsewhere_waits_for_its_expiry(storage: Storage) -> None:
    clock = FakeClock()
    elsewhere = ShardClaims(storage, "node-2", lease_s=30, clock=clock)
    elsewhere.holder = replace(elsewhere.holder, host="gpu-7", pid=1, machine="b00t pid:[1]")
    mine = ShardClaims(storage, "node-1", lease_s=30, clock=clock)
    assert elsewhere.claim(3)
    clock.now += 29
    assert not mine.claim(3)
    clock.now += 1
    assert mine.claim(3)


def test_the_fence_renews_a_claim_running_out_and_refuses_one_taken(storage: Storage) -> None:
    """Less than a third of its lease left and nobody else on it: the fence renews it (one
    atomic create) and the commit goes on. Before, the shard was dropped as lost."""
    clock = FakeClock()
    claims = ShardClaims(storage, "node-1", lease_s=30, clock=clock)
    assert claims.claim(5)
    first = claims.latest(5)
    assert first is not None
    clock.now += 21  # 9 s of 30 left
    assert not claims.owns(5, margin_s=10)
    assert claims.fence(5)
    renewed = claims.latest(5)
    assert renewed is not None and renewed.generation == first.generation + 1
    assert renewed.expires_at == clock.now + 30
    clock.now += 31  # run out: nobody took it, so the fence renews it still
    assert claims.fence(5)
    other = ShardClaims(storage, "node-2", lease_s=30, clock=lambda: clock.now + 31)
    assert other.claim(5)
    assert not claims.fence(5), "taken over: no commit"


def test_the_output_fence_renews_its_own_lease_running_out_and_trusts_a_shared_one(
    storage: Storage, other_process: psutil.Process
) -> None:
    """A run that stalled past its lease (nobody took it) renews at its fence and commits; a
    node of a multi-node run, which shares its parent's lease, leaves the renewal to the
    parent and writes nothing."""
    stalled = OutputLease(
        storage, Holder.this_process(run_id="run-a"), clock=lambda: time.time() - 200
    )
    stalled.take()
    before = read_lease(storage)
    assert before is not None and before.why_dead(time.time()) is not None
    check_held(storage, "run-a")
    after = read_lease(storage)
    assert after is not None and after.generation == before.generation + 1
    assert after.holder == before.holder and after.why_dead(time.time()) is None
    stalled.release()

    parent = replace(
        Holder.this_process(run_id="run-b"), pid=other_process.pid,
        pid_started=other_process.create_time(),
    )  # fmt: skip
    OutputLease(storage, parent, clock=lambda: time.time() - 100).take()
    shared = read_lease(storage)
    check_held(storage, "run-b")  # a node of run-b: 20 s left, the parent's to renew
    assert read_lease(storage) == shared


def test_records_read_across_versions(storage: Storage) -> None:
    """A claim as nodes wrote it before (`node`, `expires_at`), and an output lease before
    `expires_at`: both read and judged; a record written now keeps `node` at the top for
    a node of an older regen in the same run."""
    clock = FakeClock()
    old = {"generation": 4, "node": "node-2", "expires_at": clock.now + 10}
    storage.create_exclusive(claim_key(9, 4), json.dumps(old).encode())
    claims = ShardClaims(storage, "node-1", lease_s=30, clock=clock)
    read = claims.latest(9)
    assert read is not None and read.holder is not None and read.holder.node == "node-2"
    assert read.heartbeat_at == clock.now - 20 and not claims.claim(9)
    clock.now += 10
    assert claims.claim(9)
    written = json.loads(storage.read_bytes(claim_key(9, 5)))
    assert written["node"] == "node-1" and written["expires_at"] == clock.now + 30
    beat = time.time()
    holder = {"run_id": "old-run", "host": "elsewhere", "pid": 1, "pid_started": 0.0,
              "since": beat}  # fmt: skip
    storage.create_exclusive(
        lease_key(0), json.dumps({"generation": 0, "holder": holder, "heartbeat_at": beat}).encode()
    )
    lease = read_lease(storage)
    assert lease is not None and lease.expires_at == beat + 120.0 and lease.holder is not None
    assert lease.holder.run_id == "old-run" and lease.holder.node is None


def test_an_unreadable_record_names_its_key(storage: Storage) -> None:
    storage.create_exclusive(claim_key(2, 0), b"{not json")
    with pytest.raises(UserError, match=r"claims/shard-000002\.000000000\.json: unreadable lease"):
        ShardClaims(storage, "node-1", lease_s=30).claim(2)


def test_a_release_is_a_record_with_no_holder_and_no_time_left(storage: Storage) -> None:
    clock = FakeClock()
    claims = ShardClaims(storage, "node-1", lease_s=30, clock=clock)
    assert claims.claim(1)
    claims.release(1)
    released = claims.latest(1)
    assert released == LeaseRecord(1, None, clock.now, clock.now)
    assert released.why_dead(clock.now) == "released"
