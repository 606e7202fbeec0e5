"""The dataset layout's keys and its one reader, on a local root: only what manifests name
is read, whatever else lies around (crashed attempts, old generations, other runs)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import polars as pl
import pytest

from regen.dataset import (
    claim_key,
    commit_shard,
    data_key,
    manifest_key,
    parse_claim_key,
    parse_data_key,
    parse_manifest_key,
    read_committed,
    replace_shard,
    require_dataset,
)
from regen.errors import UserError
from regen.schema import row_schema
from regen.storage import LocalStorage

FP = "run-fingerprint"


def parquet_bytes(frame: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.write_parquet(buf)
    return buf.getvalue()


def rows(shard: int, ids: list[str]) -> pl.DataFrame:
    frame = pl.DataFrame({"id": ids, "shard": [shard] * len(ids)})
    return frame.with_columns(
        pl.lit(None, dtype).alias(name)
        for name, dtype in row_schema().items()
        if name not in frame.columns
    )


def test_keys_of_seven_digit_shards_and_generations_parse_back() -> None:
    assert manifest_key(42) == "shards/shard-000042.json"
    assert manifest_key(1_234_567) == "shards/shard-1234567.json"
    assert parse_manifest_key(manifest_key(1_234_567)) == 1_234_567
    assert data_key(42) == "shards/shard-000042.parquet"
    assert data_key(42, 3) == "shards/shard-000042.g3.parquet"
    assert parse_data_key(data_key(1_234_567, 12)) == (1_234_567, 12)
    assert parse_data_key("shards/shard-000042.parquet") == (42, 1)
    assert parse_claim_key(claim_key(1_234_567, 5)) == (1_234_567, 5)
    not_keys = [
        "shards/shard-42.json",  # fewer than six digits is not this layout
        "shards/shard-000042.json.tmp",
        "shards/.shard-000042.parquet.abc123.tmp",  # a local write in progress
        "superseded/abc/shards/shard-000042.json",
        "shards/shard-000042.g.parquet",
        "claims/shard-000042.json",
    ]
    for key in not_keys:
        assert parse_manifest_key(key) is None, key
        assert parse_data_key(key) is None, key
        assert parse_claim_key(key) is None, key


def test_read_committed_reads_only_what_this_runs_manifests_name(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.write_bytes("run.json", json.dumps({"fingerprint": FP}).encode())
    commit_shard(storage, 0, rows(0, ["a", "b"]), fingerprint=FP, timings={})
    commit_shard(storage, 1, rows(1, ["c", "d"]), fingerprint=FP, timings={})
    commit_shard(storage, 1_234_567, rows(1_234_567, ["z"]), fingerprint=FP, timings={})
    # Shard 1 replaced; its first generation is put back as it is for a moment mid-replace.
    first = storage.read_bytes(data_key(1))
    replace_shard(
        storage, 1, rows(1, ["c"]).with_columns(error=pl.lit("x")), fingerprint=FP, timings={}
    )
    storage.write_bytes(data_key(1), first)
    # A crashed attempt: data, no manifest.
    storage.write_bytes(data_key(2), parquet_bytes(rows(2, ["crashed"])))
    # Another run's shard, and a manifest whose data is gone.
    commit_shard(storage, 3, rows(3, ["other"]), fingerprint="another-run", timings={})
    commit_shard(storage, 4, rows(4, ["gone"]), fingerprint=FP, timings={})
    storage.delete(data_key(4))
    # A superseded run's shard lies outside shards/.
    storage.write_bytes("superseded/old/" + data_key(5), parquet_bytes(rows(5, ["old"])))
    storage.write_bytes("superseded/old/" + manifest_key(5), storage.read_bytes(manifest_key(0)))

    found = read_committed(storage)
    assert found.shards == [0, 1, 1_234_567]
    assert found.manifests[1].data == data_key(1, 2)
    assert found.census.without_data == [4]
    assert found.census.unusable == [3]
    assert found.census.orphans == [data_key(1), data_key(2)]
    table = found.collect()
    assert table["id"].to_list() == ["a", "b", "c", "d", "z"]
    assert table.filter(pl.col("id") == "c")["error"].to_list() == ["x"], "the new generation"
    assert table.schema == row_schema()
    assert found.rows == 5
    assert [(s, found.scan([s]).collect()["id"].to_list()) for s in found.shards] == [
        (0, ["a", "b"]),
        (1, ["c", "d"]),
        (1_234_567, ["z"]),
    ]
    assert found.scan([1_234_567]).collect()["id"].to_list() == ["z"]
    # The other run's shard is read only when asked for by its fingerprint.
    assert read_committed(storage, "another-run").shards == [3]


def test_a_root_without_shards_or_plan_is_refused_and_an_empty_run_is_not(
    tmp_path: Path,
) -> None:
    wrong = LocalStorage(tmp_path / "typo")
    with pytest.raises(UserError, match="not a regen dataset"):
        require_dataset(wrong, read_committed(wrong))
    started = LocalStorage(tmp_path / "run")
    started.write_bytes("plan.parquet", parquet_bytes(pl.DataFrame({"id": ["a"], "shard": [0]})))
    found = read_committed(started)
    require_dataset(started, found)
    assert found.shards == [] and found.collect().schema == row_schema()


def test_known_manifests_are_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage(tmp_path)
    commit_shard(storage, 0, rows(0, ["a"]), fingerprint=FP, timings={})
    first = read_committed(storage, FP)
    commit_shard(storage, 1, rows(1, ["b"]), fingerprint=FP, timings={})
    read: list[str] = []
    real = storage.read_bytes

    def counting(key: str) -> bytes:
        read.append(key)
        return real(key)

    monkeypatch.setattr(storage, "read_bytes", counting)
    again = read_committed(storage, FP, known=first.manifests)
    assert again.shards == [0, 1]
    assert read == [manifest_key(1)]
