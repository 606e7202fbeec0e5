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
from typing import Any

import polars as pl

from regen.dataset.keys import PLAN_KEY
from regen.dataset.manifest import Census, Manifest, take_census
from regen.dataset.plan import read_plan
from regen.dataset.runinfo import read_run, removed_policy, run_fingerprint_of
from regen.errors import UsageError
from regen.schema import row_schema
from regen.storage import Storage


@dataclass(frozen=True)
class Committed:
    """The committed shards of one root and what else its manifests said."""

    storage: Storage
    census: Census
    dropped: frozenset[str] = frozenset()
    """Ids left out of the view: gone from the input, with `input.removed: drop`. Their rows
    stay stored (and in `rows`, which counts what the manifests say)."""

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
        rows = scan_data(self.storage, [self.census.committed[s].data for s in chosen])
        return rows.filter(~pl.col("id").is_in(list(self.dropped))) if self.dropped else rows

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
    """The committed shards of `storage`'s root: of run `fingerprint`, or by default the
    dataset's view that run.json describes: its run's shards, less the ids its `removed: drop`
    leaves out (a root without run.json takes every readable manifest). A caller that names
    the fingerprint (a run polling its own commits) reads no run.json and drops nothing. See
    `take_census` for `verify` and `known`."""
    dropped: frozenset[str] = frozenset()
    if fingerprint is None:
        run = read_run(storage)
        fingerprint, dropped = run_fingerprint_of(run), dropped_ids(storage, run)
    census = take_census(storage, fingerprint, verify=verify, known=known, workers=workers)
    return Committed(storage, census, dropped)


def dropped_ids(storage: Storage, run: dict[str, Any]) -> frozenset[str]:
    """Ids the dataset view leaves out: the plan's removed ids when run.json says `drop`."""
    if removed_policy(run) != "drop":
        return frozenset()
    plan = read_plan(storage, full=True)
    if plan is None:
        return frozenset()
    return frozenset(plan.filter("removed").get_column("id").to_list())


def require_dataset(storage: Storage, committed: Committed) -> None:
    """Refuse a root that holds neither shards nor a plan: a wrong path, not an empty run."""
    if committed.census.empty and not storage.exists(PLAN_KEY):
        raise UsageError(f"{storage.uri}: no shards/ and no plan.parquet: not a regen dataset")


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
