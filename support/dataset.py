"""Reading a dataset back as a test or bench checks it: through the manifests, never a glob."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from regen.dataset import manifest_key, manifested_shards, progress_key, read_committed
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
    committed = read_committed(storage)
    found = DatasetIds(missing_data=[manifest_key(s) for s in committed.census.without_data])
    found.ids = committed.scan().select("id").collect()["id"].to_list()
    return found


def read_progress(storage: Storage) -> dict[str, Any]:
    """progress.json as a dict; raises when it is missing or not JSON."""
    progress = json.loads(storage.read_bytes(progress_key()))
    assert isinstance(progress, dict), progress
    return progress
