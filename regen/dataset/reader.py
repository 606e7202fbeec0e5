"""The one reader of a dataset's committed rows, for the audit, the exporter, the balancer's
tally, tests and benches alike.

It goes through the manifests (`take_census`) and never lists data files: only a manifest
says which generation of a shard is the committed one and whether it belongs to this run.
The rows come back lazily, all at once or shard by shard, so memory holds what the caller
collects and no more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
    dropped_by_shard: Mapping[int, frozenset[str]] = field(default_factory=dict)
    """Shard -> the ids the view leaves out of it: gone from the input, with `input.removed:
    drop`. Their rows stay stored (and in `rows`, which counts what the manifests say)."""

    @property
    def dropped(self) -> frozenset[str]:
        """Every id the view leaves out."""
        return frozenset().union(*self.dropped_by_shard.values())

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

    def identity(self, shard: int) -> str:
        """What the view of one committed shard is made from, for whatever is made from it in
        turn (its audit summary, its export file): the manifest's sha256 of the data and the
        ids the view drops from that shard. A product whose recorded identity differs is made
        again, so dropping one id remakes one shard's products, not every shard's."""
        sha256 = self.census.committed[shard].sha256
        ids = self.dropped_by_shard.get(shard)
        if not ids:
            return sha256
        drop = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]
        return f"{sha256}-drop{drop}"

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
    dropped: dict[int, frozenset[str]] = {}
    if fingerprint is None:
        run = read_run(storage)
        fingerprint, dropped = run_fingerprint_of(run), dropped_ids(storage, run)
    census = take_census(storage, fingerprint, verify=verify, known=known, workers=workers)
    return Committed(storage, census, dropped)


def dropped_ids(storage: Storage, run: dict[str, Any]) -> dict[int, frozenset[str]]:
    """Ids the dataset view leaves out, by the shard the plan put them in: the plan's removed
    ids when run.json says `drop`."""
    if removed_policy(run) != "drop":
        return {}
    plan = read_plan(storage, full=True)
    if plan is None:
        return {}
    removed = plan.filter("removed").group_by("shard").agg("id")
    return {shard: frozenset(ids) for shard, ids in removed.iter_rows()}


def view_plan(storage: Storage, committed: Committed) -> pl.DataFrame | None:
    """plan.parquet's id and shard of every id in the view (the dropped ones left out), or
    None when the root has no plan."""
    plan = read_plan(storage)
    if plan is None or not committed.dropped:
        return plan
    return plan.filter(~pl.col("id").is_in(list(committed.dropped)))


def require_dataset(storage: Storage, committed: Committed) -> None:
    """Refuse a root that holds neither shards nor a plan: a wrong path, not an empty run."""
    if committed.census.empty and not storage.exists(PLAN_KEY):
        raise UsageError(f"{storage.uri}: no shards/ and no plan.parquet: not a regen dataset")


def scan_data(storage: Storage, keys: list[str]) -> pl.LazyFrame:
    """Data objects named by manifests, lazily, in the row schema (columns a shard written by
    older code lacks come back null, and so do the struct fields it lacks: a message's tool
    fields, a turn's calls)."""
    if not keys:
        return pl.LazyFrame(schema=row_schema())
    return pl.scan_parquet(
        [storage.polars_path(key) for key in keys],
        schema=row_schema(),
        storage_options=storage.polars_options(),
        missing_columns="insert",
        extra_columns="ignore",
        cast_options=pl.ScanCastOptions(missing_struct_fields="insert"),
    )
