"""The shard plan, run.json, and the commit protocol that makes resume safe.

Plan: shard k holds valid rows [k*S, (k+1)*S) in input order, so the same prompts and shard
size always give the same shards.

Commit: `Storage.write_bytes` is atomic on every back end (temp file + rename locally, a single
PUT on S3), so the data object is written straight to its key, its checksum computed from the
bytes written, and only then the manifest `shards/shard-000042.json`. The manifest is the commit
mark: data without a manifest is a crashed attempt and is generated again.

Replace (retry_errors): the fixed shard goes to a new generation key
(`shards/shard-000042.g2.parquet`), then the manifest is overwritten to point at it (its `data`
field), then older generations are deleted. A reader that goes through the manifest sees the old
pair or the new pair, never a mix; readers must list data through manifests, not a glob, since
for a moment two generations of one shard exist.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from regen.config import RegenConfig
from regen.conversations import Turns, conversation_for
from regen.errors import FingerprintMismatch, UserError
from regen.fingerprint import changed_components, run_fingerprint
from regen.prompts import PromptSet
from regen.schema import row_schema
from regen.storage import Storage

RUN_KEY = "run.json"
PLAN_KEY = "plan.parquet"
SHARDS_PREFIX = "shards/"
SUPERSEDED_PREFIX = "superseded/"
_MANIFEST_KEY = re.compile(r"^shards/shard-(\d{6})\.json$")
_RANGE = re.compile(r"^(\d*):(\d*)$")


@dataclass(frozen=True)
class ShardPlan:
    """`assignments` has one row per valid input id: id (String), shard (Int64)."""

    num_rows: int
    shard_size: int
    num_shards: int
    assignments: pl.DataFrame


@dataclass(frozen=True)
class RunInfo:
    """What run.json records: enough to refuse mixing shards of different runs.

    `format` is the prompts' one row format, or `mixed`; `formats` counts the valid rows of
    each format (a run.json written before it existed reads back with it empty).
    """

    input_fingerprint: str
    input_path: str
    format: str
    model: dict[str, Any]
    sampling: dict[str, Any]
    shard_size: int
    num_rows: int
    num_shards: int
    fingerprint: str
    components: dict[str, Any]
    regeneration: dict[str, Any] = field(default_factory=dict)
    formats: dict[str, int] = field(default_factory=dict)
    created: str = field(default_factory=lambda: _now())

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RunInfo:
        return cls(**json.loads(data))


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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        return cls(**json.loads(data))


def plan_shards(prompt_set: PromptSet, shard_size: int) -> ShardPlan:
    """Deterministic: the valid rows in input order, cut every `shard_size` rows."""
    if shard_size <= 0:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    assignments = prompt_set.valid.select(
        "id", (pl.int_range(pl.len(), dtype=pl.Int64) // shard_size).alias("shard")
    )
    num_rows = assignments.height
    return ShardPlan(num_rows, shard_size, -(-num_rows // shard_size), assignments)


def manifest_key(shard: int) -> str:
    return f"{SHARDS_PREFIX}shard-{shard:06d}.json"


def data_key(shard: int, generation: int = 1) -> str:
    suffix = "" if generation == 1 else f".g{generation}"
    return f"{SHARDS_PREFIX}shard-{shard:06d}{suffix}.parquet"


# --- run.json ----------------------------------------------------------------------------------


def new_run_info(config: RegenConfig, prompt_set: PromptSet, plan: ShardPlan) -> RunInfo:
    """This run's run.json, fingerprinted over input, model, sampling, regeneration, shard size
    and template."""
    model = {
        "served_name": config.model.served_name,
        "source": config.model.source,
        "revision": config.model.revision,
    }
    sampling = config.sampling.model_dump()
    regeneration = config.regeneration.model_dump()
    chat_template = {
        "enable_thinking": config.regeneration.enable_thinking,
        "reasoning_parser": config.engine.reasoning_parser,
    }
    digest, components = run_fingerprint(
        prompt_set.fingerprint,
        model=model,
        sampling=sampling,
        regeneration=regeneration,
        shard_size=plan.shard_size,
        chat_template=chat_template,
    )
    return RunInfo(
        input_fingerprint=prompt_set.fingerprint,
        input_path=prompt_set.path,
        format=prompt_set.format,
        formats=prompt_set.formats,
        model=model,
        sampling=sampling,
        regeneration=regeneration,
        shard_size=plan.shard_size,
        num_rows=plan.num_rows,
        num_shards=plan.num_shards,
        fingerprint=digest,
        components=components,
    )


def open_run(storage: Storage, new_info: RunInfo, plan: ShardPlan, *, new_output: bool) -> RunInfo:
    """Claim the dataset root for this run, or resume the run that made it.

    A root made with another fingerprint is refused, naming what changed. With `new_output`
    the user says "start over here": everything of the old run moves under
    `superseded/<old fingerprint>/` (copied, then deleted; run.json last, so a crash midway is
    finished by running again) and the run starts fresh. Data is never deleted outright.
    """
    try:
        old = RunInfo.from_json(storage.read_bytes(RUN_KEY))
    except FileNotFoundError:
        old = None
    except (ValueError, TypeError) as err:
        raise UserError(f"{storage.uri}/{RUN_KEY}: unreadable run.json ({err})") from None
    if old is not None and old.fingerprint == new_info.fingerprint:
        if not storage.exists(PLAN_KEY):
            storage.write_bytes(PLAN_KEY, _parquet_bytes(plan.assignments))
        return old
    if old is not None and not new_output:
        changes = changed_components(old.components, new_info.components)
        raise FingerprintMismatch(
            f"{storage.uri}: run.json was made with {'; '.join(changes[:3]) or 'another run'}; "
            "use a new output or generation.new_output: true"
        )
    if old is not None:
        _supersede(storage, old.fingerprint)
    # The plan first: a run.json always has its plan next to it.
    storage.write_bytes(PLAN_KEY, _parquet_bytes(plan.assignments))
    storage.write_bytes(RUN_KEY, new_info.to_json())
    return new_info


def _supersede(storage: Storage, old_fingerprint: str) -> None:
    keys = [k for k in storage.list() if not k.startswith(SUPERSEDED_PREFIX)]
    target = f"{SUPERSEDED_PREFIX}{old_fingerprint}/"
    for key in keys:
        storage.write_bytes(target + key, storage.read_bytes(key))
    for key in sorted(keys, key=lambda k: k == RUN_KEY):
        storage.delete(key)


# --- commit protocol ---------------------------------------------------------------------------


def commit_shard(
    storage: Storage,
    shard: int,
    rows: pl.DataFrame,
    *,
    fingerprint: str,
    timings: dict[str, float],
    node: str | None = None,
) -> Manifest:
    """Write the shard's data, then its manifest. Refuses a shard already committed."""
    existing = read_manifest(storage, shard)
    if existing is not None and existing.fingerprint == fingerprint:
        raise ValueError(f"shard {shard} is already committed; use replace_shard")
    return _write(storage, shard, rows, fingerprint, timings, generation=1, node=node)


def replace_shard(
    storage: Storage,
    shard: int,
    fixed: pl.DataFrame,
    *,
    fingerprint: str,
    timings: dict[str, float],
) -> Manifest:
    """Swap regenerated rows into a committed shard: each id stays exactly once, in its place.

    Order: new data generation, then the manifest pointing at it, then old generations go.
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
    manifest = _write(storage, shard, merged, fingerprint, timings, generation=old.generation + 1)
    prefix = f"{SHARDS_PREFIX}shard-{shard:06d}."
    for key in storage.list(prefix):
        if key.endswith(".parquet") and key != manifest.data:
            storage.delete(key)
    return manifest


def _write(
    storage: Storage,
    shard: int,
    rows: pl.DataFrame,
    fingerprint: str,
    timings: dict[str, float],
    *,
    generation: int,
    node: str | None = None,
) -> Manifest:
    rows = _conform(shard, rows)
    data = _parquet_bytes(rows)
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
        written_at=_now(),
        node=node,
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
    return {
        int(m.group(1)) for key in storage.list(SHARDS_PREFIX) if (m := _MANIFEST_KEY.match(key))
    }


def committed_shards(
    storage: Storage, fingerprint: str, *, verify: bool = False
) -> dict[int, Manifest]:
    """Shards whose manifest matches `fingerprint` and whose data object exists.

    `verify` reads every data object and compares size and sha256 with the manifest: slow on a
    big dataset, for the audit or after a suspected corruption.
    """
    keys = storage.list(SHARDS_PREFIX)
    present = set(keys)
    committed: dict[int, Manifest] = {}
    for key in keys:
        if not _MANIFEST_KEY.match(key):
            continue
        try:
            manifest = Manifest.from_json(storage.read_bytes(key))
        except (FileNotFoundError, ValueError, TypeError):
            continue
        if manifest.fingerprint != fingerprint or manifest.data not in present:
            continue
        if verify and not _intact(storage, manifest):
            continue
        committed[manifest.shard] = manifest
    return committed


def _intact(storage: Storage, manifest: Manifest) -> bool:
    try:
        data = storage.read_bytes(manifest.data)
    except FileNotFoundError:
        return False
    return len(data) == manifest.size and hashlib.sha256(data).hexdigest() == manifest.sha256


def pending_shards(
    plan: ShardPlan, committed: dict[int, Manifest], selection: range | None = None
) -> list[int]:
    """Shards of the plan (or of `selection`) without a commit, in order."""
    shards = selection if selection is not None else range(plan.num_shards)
    return [k for k in shards if k not in committed]


def parse_shard_range(spec: str | None, num_shards: int) -> range:
    """`100:200`, `100:` or `:200` (half-open, like Python); an end past the plan is clamped."""
    if spec is None or spec == "":
        return range(num_shards)
    match = _RANGE.match(spec.strip())
    if not match:
        raise UserError(f"generation.shards: {spec!r} is not START:END, e.g. 100:200")
    start = int(match.group(1) or 0)
    end = min(int(match.group(2)) if match.group(2) else num_shards, num_shards)
    if start >= num_shards:
        raise UserError(
            f"generation.shards: {spec!r} is past the plan's {num_shards} shards (0:{num_shards})"
        )
    if start >= end:
        raise UserError(f"generation.shards: {spec!r} selects no shard (start must be < end)")
    return range(start, end)


def error_rows(storage: Storage, shard: int) -> pl.DataFrame:
    """The error rows of a committed shard, for `generation.retry_errors`."""
    manifest = read_manifest(storage, shard)
    if manifest is None:
        raise ValueError(f"shard {shard} is not committed")
    if manifest.failed == 0:
        return pl.DataFrame(schema=row_schema())
    return read_shard(storage, manifest).filter(pl.col("error").is_not_null())


# --- prompt cache for shard tasks --------------------------------------------------------------


def cache_prompts(
    prompt_set: PromptSet, plan: ShardPlan, path: Path, turns: Turns = "last"
) -> Path:
    """Write id, shard, messages once, one row group per shard, so a shard task reads its rows
    by a filtered scan that skips every other row group. `messages` is already what generation
    sends (`regen.conversations`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = prompt_set.valid.select(
        "id", plan.assignments.get_column("shard"), conversation_for(turns)
    )
    tmp = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(tmp, compression="zstd", row_group_size=plan.shard_size, statistics=True)
    tmp.replace(path)
    return path


def prompts_for_shard(path: Path, shard: int) -> pl.DataFrame:
    """The prompt rows (id, shard, messages) of one shard, in plan order."""
    return pl.scan_parquet(path).filter(pl.col("shard") == shard).collect()


def _parquet_bytes(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd")
    return buf.getvalue()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
