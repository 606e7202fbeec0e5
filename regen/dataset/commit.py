"""The commit protocol that makes resume safe.

Commit: `Storage.write_bytes` is atomic on every back end (temp file + rename locally, a single
PUT on S3), so the data object is written straight to its key, its checksum computed from the
bytes written, and only then the manifest `shards/shard-000042.json`. The manifest is the commit
mark: data without a manifest is a crashed attempt and is generated again.

Replace (retry_errors): the fixed shard goes to a new generation key
(`shards/shard-000042.g2.parquet`), then the manifest is overwritten to point at it (its `data`
field), then older generations are deleted. A reader that goes through the manifest sees the old
pair or the new pair, never a mix.
"""

from __future__ import annotations

import hashlib

import polars as pl

from regen.dataset._encode import parquet_bytes, utc_now
from regen.dataset.keys import data_key, manifest_key, parse_data_key, shard_prefix
from regen.dataset.manifest import Manifest, read_manifest, read_shard
from regen.schema import row_schema
from regen.storage import Storage


class ShardCommitted(ValueError):
    """The shard was committed meanwhile by another run: its rows stand, this run's are
    dropped. Never worth a retry, never this run's failure."""

    def __init__(self, shard: int, existing: Manifest) -> None:
        by = f"node {existing.node}" if existing.node else "another run"
        super().__init__(f"shard {shard} is already committed (by {by}, at {existing.written_at})")
        self.shard = shard
        self.existing = existing


def commit_shard(
    storage: Storage,
    shard: int,
    rows: pl.DataFrame,
    *,
    fingerprint: str,
    timings: dict[str, float],
    node: str | None = None,
    revision: int = 1,
) -> Manifest:
    """Write the shard's data, then its manifest. Refuses a shard already committed."""
    existing = read_manifest(storage, shard)
    if existing is not None and existing.fingerprint == fingerprint:
        raise ShardCommitted(shard, existing)
    return _write(
        storage, shard, rows, fingerprint, timings, generation=1, node=node, revision=revision
    )


def replace_shard(
    storage: Storage,
    shard: int,
    fixed: pl.DataFrame,
    *,
    fingerprint: str,
    timings: dict[str, float],
    revision: int | None = None,
) -> Manifest:
    """Swap regenerated rows into a committed shard: each id stays exactly once, in its place.

    Order: new data generation, then the manifest pointing at it, then old generations go.
    `revision` is the input revision the shard answers once swapped (default: unchanged);
    the row an edited prompt had is superseded this way, never kept beside the new one.
    """
    old = read_manifest(storage, shard)
    if old is None or old.fingerprint != fingerprint:
        raise ValueError(f"shard {shard} is not committed by run {fingerprint[:12]}")
    current = read_shard(storage, old)
    fixed = _conform(shard, fixed)
    unknown = fixed.join(current, on="id", how="anti")
    if unknown.height:
        raise ValueError(f"shard {shard}: {unknown.height} replacement ids are not in the shard")
    kept = current.join(fixed.select("id"), on="id", how="anti")
    order = current.select("id").with_row_index("_pos")
    merged = pl.concat([kept, fixed]).join(order, on="id").sort("_pos").drop("_pos")
    manifest = _write(
        storage, shard, merged, fingerprint, timings, generation=old.generation + 1,
        revision=old.revision if revision is None else revision,
    )  # fmt: skip
    for key in storage.list(shard_prefix(shard)):
        if parse_data_key(key) is not None and key != manifest.data:
            storage.delete(key)
    return manifest


def error_rows(storage: Storage, shard: int) -> pl.DataFrame:
    """The error rows of a committed shard, for `generation.retry_errors`."""
    manifest = read_manifest(storage, shard)
    if manifest is None:
        raise ValueError(f"shard {shard} is not committed")
    if manifest.failed == 0:
        return pl.DataFrame(schema=row_schema())
    return read_shard(storage, manifest).filter(pl.col("error").is_not_null())


def _write(
    storage: Storage,
    shard: int,
    rows: pl.DataFrame,
    fingerprint: str,
    timings: dict[str, float],
    *,
    generation: int,
    node: str | None = None,
    revision: int = 1,
) -> Manifest:
    rows = _conform(shard, rows)
    data = parquet_bytes(rows)
    key = data_key(shard, generation)
    storage.write_bytes(key, data)
    failed = int(rows.get_column("error").is_not_null().sum())
    manifest = Manifest(
        shard=shard,
        data=key,
        generation=generation,
        rows=rows.height,
        ok=rows.height - failed,
        failed=failed,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        fingerprint=fingerprint,
        timings=dict(timings),
        written_at=utc_now(),
        node=node,
        revision=revision,
    )
    storage.write_bytes(manifest_key(shard), manifest.to_json())
    return manifest


def _conform(shard: int, rows: pl.DataFrame) -> pl.DataFrame:
    """Rows in the schema's column order and types; a shard's ids are its own and unique."""
    schema = row_schema()
    missing = [name for name in schema if name not in rows.columns]
    if missing:
        raise ValueError(f"shard {shard}: rows lack columns {missing}")
    rows = rows.select(pl.col(name).cast(dtype) for name, dtype in schema.items())
    if rows.get_column("shard").ne_missing(shard).any():
        raise ValueError(f"shard {shard}: rows carry another shard number")
    if rows.get_column("id").is_duplicated().any():
        raise ValueError(f"shard {shard}: an id appears twice")
    return rows
