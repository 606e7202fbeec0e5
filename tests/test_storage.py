"""Storage back ends against real file systems and a real S3 API (moto on loopback)."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from regen.errors import UserError
from regen.storage import LocalStorage, Storage, open_storage, probe
from regen.storage.s3 import RetryPolicy, S3Storage
from support.s3 import MotoS3


@pytest.fixture
def s3(moto: MotoS3) -> S3Storage:
    return moto.storage(moto.create_bucket(), "runs/r1")


def _round_trip(storage: Storage) -> None:
    storage.write_bytes("shards/shard-000001.json", b'{"rows": 1}')
    storage.write_bytes("shards/shard-000000.json", b"{}")
    storage.write_bytes("run.json", b"run")
    storage.write_bytes("run.json", b"run v2")
    assert storage.read_bytes("run.json") == b"run v2"
    assert storage.exists("shards/shard-000001.json")
    assert not storage.exists("shards/shard-000002.json")
    assert not storage.exists("shards")
    assert storage.list("shards/") == ["shards/shard-000000.json", "shards/shard-000001.json"]
    assert storage.list("shards/shard-000001") == ["shards/shard-000001.json"]
    assert storage.list() == ["run.json", "shards/shard-000000.json", "shards/shard-000001.json"]
    storage.delete("run.json")
    storage.delete("run.json")
    assert not storage.exists("run.json")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("run.json")


def test_s3_round_trip(s3: S3Storage) -> None:
    _round_trip(s3)
    assert s3.uri.startswith("s3://regen-test-") and s3.uri.endswith("/runs/r1")


def test_local_round_trip(tmp_path: Path) -> None:
    _round_trip(LocalStorage(tmp_path / "root"))


def test_polars_scans_parquet_written_through_s3(s3: S3Storage) -> None:
    for shard in range(3):
        buf = io.BytesIO()
        pl.DataFrame({"id": [f"{shard}-a", f"{shard}-b"], "shard": [shard, shard]}).write_parquet(
            buf
        )
        s3.write_bytes(f"shards/shard-{shard:06d}.parquet", buf.getvalue())
    options = s3.polars_options()
    assert options["aws_allow_http"] == "true"
    frame = (
        pl.scan_parquet(s3.polars_path("shards/*.parquet"), storage_options=options)
        .group_by("shard")
        .len()
        .sort("shard")
        .collect()
    )
    assert frame["len"].to_list() == [2, 2, 2]


def test_missing_bucket_is_a_quick_user_error(moto: MotoS3) -> None:
    # Quick: each call is sent once. A missing bucket retried like an outage would send it
    # again and again, for the whole 30 s deadline (which also bounds the test).
    calls: list[str] = []
    storage = S3Storage(
        "regen-nosuch-bucket", "x", lambda: moto.counting_client(calls),
        retry=RetryPolicy(deadline_s=30),
    )  # fmt: skip
    with pytest.raises(UserError, match=r"^s3://regen-nosuch-bucket: bucket does not exist$"):
        storage.write_bytes("run.json", b"{}")
    assert calls == ["PutObject"], "the missing bucket was retried as an outage"
    calls.clear()
    with pytest.raises(UserError, match="regen-nosuch-bucket"):
        storage.exists("run.json")
    assert calls and len(set(calls)) == len(calls), calls
    calls.clear()
    with pytest.raises(UserError, match="regen-nosuch-bucket"):
        probe(storage)
    assert calls == ["PutObject"], calls


def test_write_survives_an_outage(moto: MotoS3) -> None:
    storage = moto.storage(moto.create_bucket(), "out", retry=RetryPolicy(deadline_s=30))
    moto.stop()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            storage.write_bytes("progress.json", b"during outage")
        except BaseException as err:
            errors.append(err)

    writer = threading.Thread(target=write)
    try:
        writer.start()
        time.sleep(1.0)
        assert writer.is_alive(), f"the write gave up while S3 was down: {errors}"
    finally:
        moto.start()
    writer.join(timeout=20)
    assert not writer.is_alive() and not errors
    assert storage.read_bytes("progress.json") == b"during outage"


def test_outage_past_the_deadline_names_the_bucket(moto: MotoS3) -> None:
    bucket = moto.create_bucket()
    storage = moto.storage(bucket, retry=RetryPolicy(deadline_s=0.5))
    moto.stop()
    try:
        with pytest.raises(UserError, match=rf"s3://{bucket}: put_object failed for 0.5 s"):
            storage.write_bytes("k", b"x")
    finally:
        moto.start()


def test_open_storage_uses_the_environment(moto: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = moto.create_bucket()
    for name, value in moto.env.items():
        monkeypatch.setenv(name, value)
    storage = open_storage(f"s3://{bucket}/root")
    probe(storage)
    storage.write_bytes("run.json", b"{}")
    assert moto.storage(bucket, "root").read_bytes("run.json") == b"{}"
    options = storage.polars_options()
    assert options is not None and options["aws_endpoint_url"] == moto.endpoint_url


def test_s3_bucket_block_builds_storage(moto: MotoS3) -> None:
    from prefect_aws import AwsClientParameters, AwsCredentials, S3Bucket

    from blocks.storage import storage_from_s3_bucket_block

    bucket = moto.create_bucket()
    block = S3Bucket(
        bucket_name=bucket,
        bucket_folder="datasets/a",
        credentials=AwsCredentials(
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
            aws_client_parameters=AwsClientParameters(
                endpoint_url=moto.endpoint_url, config={"retries": {"max_attempts": 9}}
            ),
        ),
    )
    storage = storage_from_s3_bucket_block(block)
    storage.write_bytes("run.json", b"block")
    assert moto.storage(bucket, "datasets/a").read_bytes("run.json") == b"block"
    # Our layer owns retries: the block's botocore retry setting must not stack on top.
    config = storage._client().meta.config
    assert config.retries["total_max_attempts"] == 1  # type: ignore[attr-defined]  # set at run time
    assert storage.polars_options()["aws_access_key_id"] == "testing"


def test_local_write_is_atomic_and_follows_umask(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    old = os.umask(0o027)
    try:
        storage.write_bytes("report/audit.json", b"{}")
    finally:
        os.umask(old)
    path = tmp_path / "report" / "audit.json"
    assert path.read_bytes() == b"{}"
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in path.parent.iterdir()] == ["audit.json"]


def test_local_probe_names_an_unwritable_root(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match=rf"{blocker}/root: not writable"):
        probe(LocalStorage(blocker / "root"))
    probe(LocalStorage(tmp_path / "fine"))
    assert LocalStorage(tmp_path / "fine").list() == []


def test_s3_put_file_uploads_a_large_file_in_parts_from_disk(s3: S3Storage, tmp_path: Path) -> None:
    from boto3.s3.transfer import TransferConfig

    # 11 MB in 5 MB parts: three parts, as a file past one PUT's 5 GB goes up.
    data = os.urandom(11 * 2**20)
    path = tmp_path / "big.jsonl"
    path.write_bytes(data)
    parts = TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20)
    s3.put_file("exports/big.jsonl", path, transfer=parts)
    assert s3.read_bytes("exports/big.jsonl") == data
    head = s3._client().head_object(Bucket=s3.bucket, Key=s3._key("exports/big.jsonl"))
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # a multipart upload's ETag


def test_local_put_file_moves_into_place_with_the_umask(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "root")
    (tmp_path / "root").mkdir()
    tmp = tmp_path / "root" / ".part.tmp"
    tmp.write_bytes(b"lines\n")
    old = os.umask(0o027)
    try:
        storage.put_file("exports/all.jsonl", tmp)
    finally:
        os.umask(old)
    path = tmp_path / "root" / "exports" / "all.jsonl"
    assert path.read_bytes() == b"lines\n" and not tmp.exists()
    assert path.stat().st_mode & 0o777 == 0o640
