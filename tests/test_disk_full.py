"""Disk full on the output: the failing shard is not committed, every committed one stays valid."""

from __future__ import annotations

import errno
import os
import subprocess
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
