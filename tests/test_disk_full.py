"""Disk full on the output: the failing shard is not committed, every committed one stays valid."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from regen.dataset import commit_shard, committed_shards
from regen.schema import row_schema
from regen.storage import LocalStorage, Storage


class _FullAfter(LocalStorage):
    """Where no small file system can be mounted: the same interface, failing like a full disk."""

    def __init__(self, root: Path, budget: int) -> None:
        super().__init__(root)
        self.budget = budget

    def write_bytes(self, key: str, data: bytes) -> None:
        if len(data) > self.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self._path(key)))
        self.budget -= len(data)
        super().write_bytes(key, data)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Storage]:
    """A real 256 KiB tmpfs when this machine lets us mount one (root in CI), else the fake."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        yield LocalStorage(mount) if mounted else _FullAfter(mount, budget=256 * 1024)
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=False)


def _shard_rows(shard: int, n: int = 40) -> pl.DataFrame:
    # Incompressible answers, so every shard takes real space on the small disk.
    noise = [os.urandom(900).hex() for _ in range(n)]
    return pl.DataFrame(
        {
            "id": [f"s{shard}-{i}" for i in range(n)],
            "shard": [shard] * n,
            "messages": [[{"role": "user", "content": "q"}]] * n,
            "content": noise,
            "reasoning_content": noise,
            "finish_reason": ["stop"] * n,
            "prompt_tokens": [3] * n,
            "completion_tokens": [100] * n,
            "reasoning_tokens": [50] * n,
            "model": ["m"] * n,
            "server": ["server-0"] * n,
            "attempts": [1] * n,
            "latency_s": [0.1] * n,
            "error": [None] * n,
            "turns": [[]] * n,
            "sampling": [None] * n,
            "tools": [None] * n,
        },
        schema=row_schema(),
    )


def test_disk_full_keeps_committed_shards_and_commits_no_partial(small_disk: Storage) -> None:
    committed: list[int] = []
    with pytest.raises(OSError) as failure:
        for shard in range(100):
            commit_shard(small_disk, shard, _shard_rows(shard), fingerprint="fp", timings={})
            committed.append(shard)
    assert failure.value.errno == errno.ENOSPC
    assert committed, "the disk filled before the first shard: make the shards smaller"
    failed = len(committed)
    found = committed_shards(small_disk, "fp", verify=True)
    assert sorted(found) == committed, "a committed shard was lost or a partial one committed"
    assert not small_disk.exists(f"shards/shard-{failed:06d}.json")
    leftovers = [k for k in small_disk.list("shards/") if ".tmp" in k]
    assert not leftovers
    if isinstance(small_disk, LocalStorage):
        assert not [p for p in small_disk.root.rglob("*.tmp")], "a temp file was left behind"


@pytest.fixture
def tiny_mount(tmp_path: Path) -> Iterator[Path]:
    """A real 16 MB tmpfs (root only: skipped where it cannot be mounted): room for what
    `regen check` estimates the run writes, so the disk fills during the run, as it does when
    something else on the node takes the space."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.timeout(300)
def test_a_rehearsal_on_a_full_disk_stops_at_once_in_one_line(
    tmp_path: Path, tiny_mount: Path, regen_env: dict[str, str]
) -> None:
    """The issue's run: output on a tiny file system. Before, ENOSPC was retried twice (each
    regenerating the shard) and the last line listed committed shards as failed."""
    from regen.rehearsal import bundled
    from support.chaos import write_chaos_config
    from support.dataset import dataset_ids

    config = write_chaos_config(tmp_path / "regen.yaml", tmp_path / "work", time_scale=0.2)
    out = tiny_mount / "out"
    prompts = str(bundled("sample_prompts.jsonl"))
    args = ["rehearse", "--config", str(config), "--out", str(out), "--servers", "2"]
    run = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args, "--prompts", prompts],
        cwd=tmp_path, env=regen_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # Once a shard has committed, something else on the node takes the rest of the disk.
        deadline = time.monotonic() + 200
        while not list((out / "shards").glob("*.json")) if (out / "shards").exists() else True:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
            time.sleep(0.05)
        _fill(tiny_mount / "filler")
        said, _ = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, said[-4000:]
    line = [x for x in said.splitlines() if x.startswith("regen: run failed")]
    assert len(line) == 1 and "disk full on tmpfs at " in line[0], said[-4000:]
    assert "which holds the output" in line[0] and "free" in line[0]
    assert "Retry 1/" not in said and "already committed" not in said
    print(line[0])
    ids = dataset_ids(LocalStorage(out))
    assert ids.missing_data == [] and ids.doubled() == []


def _fill(path: Path) -> None:
    """Write zeros until the file system is full."""
    chunk = b"\0" * 65536
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)


def test_a_full_disk_is_never_retried_and_starts_no_new_shard() -> None:
    from concurrent import futures

    from regen.generation.loop import run_all
    from regen.generation.outcome import ShardOutcome
    from regen.generation.shard import worth_retrying
    from regen.storage.diskfull import DiskFull, disk_full, is_disk_full

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/")
    assert is_disk_full(full) and not worth_retrying(full)
    assert not worth_retrying(disk_full(full, "/", None))
    started: list[int] = []

    def submit(shard: int, lease: object) -> futures.Future[ShardOutcome]:
        started.append(shard)
        future: futures.Future[ShardOutcome] = futures.Future()
        if shard == 0:
            future.set_exception(disk_full(full, "/data/out", 10**9))
        else:
            future.set_result(ShardOutcome.lost(shard, 0.0))
        return future

    result = run_all(list(range(10)), submit, window=1)
    assert started == [0], "a shard started after the disk was full"
    assert isinstance(result.fatal, DiskFull) and "needs about 1.00 GB" in str(result.fatal)
