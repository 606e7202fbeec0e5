"""Reading a dataset back as a test or bench checks it: through the manifests, never a glob.

Today this goes through regen.shards (`manifested_shards`, `read_manifest`); it is the one
place to point at the dataset package's `read_committed()` reader once that lands.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from regen.shards import manifest_key, manifested_shards, read_manifest
from regen.storage import Storage


def manifest_keys(storage: Storage) -> list[str]:
    """The storage keys of every committed manifest, in shard order."""
    return [manifest_key(shard) for shard in sorted(manifested_shards(storage))]


@dataclass
class DatasetIds:
    """The ids of a dataset read through its manifests, and the manifests whose data is gone."""

    ids: list[str] = field(default_factory=list)
    missing_data: list[str] = field(default_factory=list)

    def lost(self, expected: list[str]) -> list[str]:
        return sorted(set(expected) - set(self.ids))

    def doubled(self) -> list[str]:
        """Ids present in more than one row (a shard written twice, or an id in two shards)."""
        ids = pl.Series("id", self.ids, dtype=pl.String)
        return sorted(ids.filter(ids.is_duplicated()).unique().to_list())


def dataset_ids(storage: Storage) -> DatasetIds:
    """Every id of every committed shard, read from the data object its manifest names."""
    found = DatasetIds()
    for shard in sorted(manifested_shards(storage)):
        manifest = read_manifest(storage, shard)
        if manifest is None:
            continue  # moved aside between the listing and the read
        try:
            data = storage.read_bytes(manifest.data)
        except FileNotFoundError:
            found.missing_data.append(manifest.data)
            continue
        found.ids += pl.read_parquet(io.BytesIO(data), columns=["id"])["id"].to_list()
    return found


def read_progress(storage: Storage) -> dict[str, Any]:
    """progress.json as a dict; raises when it is missing or not JSON."""
    progress = json.loads(storage.read_bytes("progress.json"))
    assert isinstance(progress, dict), progress
    return progress
