"""Manifests, the commit marks: which shards a root holds and where their data is.

A shard is committed when its manifest exists, names a data object that exists and carries
the run's fingerprint. Data without a manifest is a crashed attempt, a replaced shard has two
generations for a moment, and a manifest of another fingerprint is a superseded run's: so a
reader finds data only through manifests, never by listing data files.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import polars as pl

from regen.dataset.keys import SHARDS_PREFIX, manifest_key, parse_data_key, parse_manifest_key
from regen.storage import Storage


@dataclass(frozen=True)
class Manifest:
    """The commit mark of one shard; `data` names its data object (it changes on replace)."""

    shard: int
    data: str
    generation: int
    rows: int
    ok: int
    failed: int
    sha256: str
    size: int
    fingerprint: str
    timings: dict[str, float]
    written_at: str
    # Which node of a multi-node run generated the shard; None for a single-node run.
    node: str | None = None
    # The input revision the shard's rows answer: a row whose content came in a later one is
    # owed (regen.dataset.plan.owed). Manifests older than revisions read back as 1.
    revision: int = 1

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Raises ValueError or TypeError on anything but a manifest."""
        manifest = cls(**json.loads(data))
        if not isinstance(manifest.data, str) or not isinstance(manifest.shard, int):
            raise ValueError("a manifest's data must be a key and its shard a number")
        return manifest


@dataclass(frozen=True)
class Census:
    """The manifests of a root sorted by what they say: `committed` in shard order."""

    committed: dict[int, Manifest]
    without_data: list[int]
    unusable: list[int]
    """Unreadable, naming another shard, written by another run, or failing `verify`."""
    orphans: list[str]
    """Data objects no readable manifest names: crashed attempts, old generations."""
    empty: bool
    """Nothing at all under shards/."""


def read_manifest(storage: Storage, shard: int) -> Manifest | None:
    try:
        return Manifest.from_json(storage.read_bytes(manifest_key(shard)))
    except FileNotFoundError:
        return None


def read_shard(storage: Storage, manifest: Manifest) -> pl.DataFrame:
    return pl.read_parquet(io.BytesIO(storage.read_bytes(manifest.data)))


def manifested_shards(storage: Storage) -> set[int]:
    """Shards that have a manifest, from one listing and no reads: cheap enough to ask often.

    Within one run's root this is the committed set (open_run moved any other run's manifests
    aside); a decision that must not be wrong reads the manifest itself.
    """
    keys = storage.list(SHARDS_PREFIX)
    return {shard for key in keys if (shard := parse_manifest_key(key)) is not None}


def take_census(
    storage: Storage,
    fingerprint: str | None,
    *,
    verify: bool = False,
    known: Mapping[int, Manifest] | None = None,
    workers: int = 16,
) -> Census:
    """Read every manifest (in parallel: on S3 each is a GET) and sort them out.

    `fingerprint` None takes a manifest of any run. `verify` reads every data object and
    compares size and sha256 with its manifest: slow on a big dataset, for the audit or after
    a suspected corruption. `known` holds committed manifests read before, taken as they are
    without a read: within a run a committed manifest only changes by `replace_shard`, so a
    poll that passes what it found last time reads only the new ones.
    """
    known = known or {}
    keys = storage.list(SHARDS_PREFIX)
    present = set(keys)
    numbered = [(shard, key) for key in keys if (shard := parse_manifest_key(key)) is not None]

    def judge(item: tuple[int, str]) -> tuple[Manifest | None, str]:
        shard, key = item
        try:
            manifest = known.get(shard) or Manifest.from_json(storage.read_bytes(key))
        except (FileNotFoundError, ValueError, TypeError):
            return None, "unusable"
        other_run = fingerprint is not None and manifest.fingerprint != fingerprint
        if manifest.shard != shard or other_run:
            return manifest, "unusable"
        if manifest.data not in present:
            return manifest, "without_data"
        if verify and not _intact(storage, manifest):
            return manifest, "unusable"
        return manifest, "committed"

    with ThreadPoolExecutor(max_workers=workers) as pool:
        verdicts = list(pool.map(judge, numbered))
    committed: dict[int, Manifest] = {}
    sorts: dict[str, list[int]] = {"without_data": [], "unusable": []}
    for (shard, _), (manifest, verdict) in zip(numbered, verdicts, strict=True):
        if verdict == "committed" and manifest is not None:
            committed[shard] = manifest
        else:
            sorts[verdict].append(shard)
    named = {m.data for m, _ in verdicts if m is not None}
    orphans = [k for k in keys if parse_data_key(k) is not None and k not in named]
    return Census(
        dict(sorted(committed.items())),
        sorts["without_data"],
        sorts["unusable"],
        orphans,
        empty=not keys,
    )


def committed_shards(
    storage: Storage, fingerprint: str, *, verify: bool = False
) -> dict[int, Manifest]:
    """Shards whose manifest matches `fingerprint` and whose data object exists (and, with
    `verify`, matches its checksum)."""
    return take_census(storage, fingerprint, verify=verify).committed


def _intact(storage: Storage, manifest: Manifest) -> bool:
    try:
        data = storage.read_bytes(manifest.data)
    except FileNotFoundError:
        return False
    return len(data) == manifest.size and hashlib.sha256(data).hexdigest() == manifest.sha256
