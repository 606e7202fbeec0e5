"""The one reader of a dataset's committed rows, for the audit, the exporter, the balancer's
tally, tests and benches alike.

It goes through the manifests (`take_census`) and never lists data files: only a manifest
says which generation of a shard is the committed one and whether it belongs to this run.
The rows come back lazily, all at once or shard by shard, so memory holds what the caller
collects and no more.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import polars as pl

from regen.dataset.keys import PLAN_KEY
from regen.dataset.manifest import Census, Manifest, take_census
from regen.dataset.runinfo import read_run, run_fingerprint_of
from regen.errors import UserError
from regen.schema import row_schema
from regen.storage import Storage


@dataclass(frozen=True)
class Committed:
    """The committed shards of one root and what else its manifests said."""

    storage: Storage
    census: Census

    @property
    def manifests(self) -> dict[int, Manifest]:
        """Shard -> its manifest, in shard order."""
        return self.census.committed

    @property
    def shards(self) -> list[int]:
        return list(self.census.committed)

    @property
    def rows(self) -> int:
        return sum(m.rows for m in self.census.committed.values())

    def scan(self, shards: Iterable[int] | None = None) -> pl.LazyFrame:
        """The rows of every committed shard (or of `shards`, each committed), in shard order,
        in the row schema; an empty frame when there are none."""
        chosen = self.shards if shards is None else sorted(shards)
        return scan_data(self.storage, [self.census.committed[s].data for s in chosen])

    def frames(self) -> Iterator[tuple[int, pl.DataFrame]]:
        """(shard, rows) one shard at a time."""
        for shard in self.shards:
            yield shard, self.scan([shard]).collect()

    def collect(self) -> pl.DataFrame:
        return self.scan().collect()


def read_committed(
    storage: Storage,
    fingerprint: str | None = None,
    *,
    verify: bool = False,
    known: Mapping[int, Manifest] | None = None,
    workers: int = 16,
) -> Committed:
    """The committed shards of `storage`'s root: of run `fingerprint`, by default run.json's
    (a root without run.json takes every readable manifest). See `take_census` for `verify`
    and `known`."""
    if fingerprint is None:
        fingerprint = run_fingerprint_of(read_run(storage))
    census = take_census(storage, fingerprint, verify=verify, known=known, workers=workers)
    return Committed(storage, census)


def require_dataset(storage: Storage, committed: Committed) -> None:
    """Refuse a root that holds neither shards nor a plan: a wrong path, not an empty run."""
    if committed.census.empty and not storage.exists(PLAN_KEY):
        raise UserError(f"{storage.uri}: no shards/ and no plan.parquet: not a regen dataset")


def scan_data(storage: Storage, keys: list[str]) -> pl.LazyFrame:
    """Data objects named by manifests, lazily, in the row schema (columns a shard written by
    older code lacks come back null)."""
    if not keys:
        return pl.LazyFrame(schema=row_schema())
    return pl.scan_parquet(
        [storage.polars_path(key) for key in keys],
        schema=row_schema(),
        storage_options=storage.polars_options(),
        missing_columns="insert",
        extra_columns="ignore",
    )
