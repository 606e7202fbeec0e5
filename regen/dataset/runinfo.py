"""run.json: what a run is, so shards of different runs are never mixed in one root.

A root made with another fingerprint is refused, naming what changed, or (with `new_output`)
moved aside under `superseded/<old fingerprint>/`; data is never deleted outright. The input
is not fingerprinted: a root's prompt set may change between runs, and run.json keeps the
record of each input revision (when, how many new, changed and removed ids).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast

from regen.dataset._encode import parquet_bytes, utc_now
from regen.dataset.keys import (
    LEASE_PREFIX,
    PLAN_KEY,
    RUN_KEY,
    SHARDS_PREFIX,
    SUPERSEDED_PREFIX,
    parse_manifest_key,
    superseded_prefix,
)
from regen.errors import FingerprintMismatch, UserError
from regen.fingerprint import changed_components, run_fingerprint
from regen.storage import Storage

if TYPE_CHECKING:  # only read: importing them would cycle (regen.config imports the audit)
    from regen.config import RegenConfig
    from regen.dataset.plan import ShardPlan
    from regen.prompts import PromptSet

Thinking = Literal["save", "drop", "off"]
Removed = Literal["keep", "drop"]


@dataclass(frozen=True)
class RunInfo:
    """What run.json records: enough to refuse mixing shards of different runs.

    `format` is the prompts' one row format, or `mixed`; `formats` counts the valid rows of
    each format (a run.json written before it existed reads back with it empty). The input
    fields describe the latest revision; `revisions` lists them all, oldest first, and
    `removed` (the config's `input.removed`) says whether the dataset view keeps the rows of
    ids the input no longer has. `source` says where a Hub prompt set was read from (repo,
    revision asked for, the commit it resolved to, files); each revision keeps its own.
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
    created: str = field(default_factory=utc_now)
    revisions: list[dict[str, Any]] = field(default_factory=list)
    removed: Removed = "keep"
    source: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RunInfo:
        return cls(**json.loads(data))


def read_run(storage: Storage) -> dict[str, Any]:
    """run.json as it is stored, {} when there is none: readers of old or partial records
    (the audit, the exporter) take what they need from it."""
    try:
        run = json.loads(storage.read_bytes(RUN_KEY))
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{storage.uri}/{RUN_KEY}: not valid JSON: {err}") from None
    return run if isinstance(run, dict) else {}


def run_fingerprint_of(run: dict[str, Any]) -> str | None:
    value = run.get("fingerprint")
    return value if isinstance(value, str) else None


def thinking_mode(run: dict[str, Any]) -> Thinking:
    """`regeneration.thinking` of a run.json; a record older than it says it by the sampling's
    `enable_thinking` (False: off); `save`, the default, when neither is there."""
    regeneration = run.get("regeneration")
    thinking = regeneration.get("thinking") if isinstance(regeneration, dict) else None
    if thinking in ("save", "drop", "off"):
        return cast(Thinking, thinking)
    if isinstance(thinking, str):  # an unknown word: only `off` stops requesting it
        return "drop"
    sampling = run.get("sampling")
    value = sampling.get("enable_thinking") if isinstance(sampling, dict) else None
    return "off" if value is False else "save"


def removed_policy(run: dict[str, Any]) -> Removed:
    """run.json's `removed`: `drop` hides the rows of ids the input no longer has."""
    return "drop" if run.get("removed") == "drop" else "keep"


def _model(config: RegenConfig) -> dict[str, Any]:
    return {
        "served_name": config.model.served_name,
        "source": config.model.source,
        "revision": config.model.revision,
    }


def config_fingerprint(
    config: RegenConfig, shard_size: int | None = None
) -> tuple[str, dict[str, Any]]:
    """(digest, components) of the run `config` describes, as its run.json will record them:
    what `regen check` compares with an output's run.json before anything is staged."""
    return run_fingerprint(
        model=_model(config),
        sampling=config.sampling.model_dump(),
        regeneration=config.regeneration.model_dump(),
        shard_size=config.shard_size if shard_size is None else shard_size,
        chat_template={
            "enable_thinking": config.regeneration.enable_thinking,
            "reasoning_parser": config.engine.reasoning_parser,
            # Only when set: a run without tools keeps the fingerprint it always had.
            **(
                {"tool_call_parser": config.engine.tool_call_parser}
                if config.engine.tool_call_parser
                else {}
            ),
        },
    )


def new_run_info(config: RegenConfig, prompt_set: PromptSet, plan: ShardPlan) -> RunInfo:
    """This run's run.json, fingerprinted over model, sampling, regeneration, shard size and
    template, with `plan`'s input revision as its one revision."""
    digest, components = config_fingerprint(config, plan.shard_size)
    model = _model(config)
    sampling = config.sampling.model_dump()
    regeneration = config.regeneration.model_dump()
    info = RunInfo(
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
        removed=config.input.removed,
        source=prompt_set.source or {},
    )
    return replace(info, revisions=[_revision(info, plan)])


def record_revision(storage: Storage, run: RunInfo, info: RunInfo, plan: ShardPlan) -> RunInfo:
    """Bring a resumed root's plan and run.json up to this run's input (`info`, `plan`).

    The plan first: a crash between the two leaves the revision planned but unrecorded, and
    the next run goes on from the plan (a revision's record is its receipt, not its state).
    Nothing is written when neither the input nor `input.removed` changed.
    """
    revisions = run.revisions
    if plan.changes.any():
        storage.write_bytes(PLAN_KEY, parquet_bytes(plan.assignments))
        revisions = [*revisions, _revision(info, plan)]
    revised = replace(
        run,
        input_fingerprint=info.input_fingerprint,
        input_path=info.input_path,
        format=info.format,
        formats=info.formats,
        num_rows=plan.num_rows,
        num_shards=plan.num_shards,
        revisions=revisions,
        removed=info.removed,
        source=info.source,
    )
    if revised != run:
        storage.write_bytes(RUN_KEY, revised.to_json())
    return revised


def _revision(info: RunInfo, plan: ShardPlan) -> dict[str, Any]:
    return {
        "revision": plan.revision,
        "when": utc_now(),
        "input_fingerprint": info.input_fingerprint,
        "input_path": info.input_path,
        "rows": plan.num_rows,
        **asdict(plan.changes),
        **({"source": info.source} if info.source else {}),
    }


def open_run(storage: Storage, new_info: RunInfo, plan: ShardPlan, *, new_output: bool) -> RunInfo:
    """Claim the dataset root for this run, or resume the run that made it.

    A root made with another fingerprint is refused, naming what changed, unless its run
    committed nothing (`has_committed`): that root is taken over as below. With `new_output`
    the user says "start over here": everything of the old run moves under
    `superseded/<old fingerprint>/` (copied, then deleted; run.json last, so a crash midway is
    finished by running again) and the run starts fresh.
    """
    try:
        old = RunInfo.from_json(storage.read_bytes(RUN_KEY))
    except FileNotFoundError:
        old = None
    except (ValueError, TypeError) as err:
        raise UserError(f"{storage.uri}/{RUN_KEY}: unreadable run.json ({err})") from None
    if old is not None and old.fingerprint == new_info.fingerprint:
        if not storage.exists(PLAN_KEY):
            storage.write_bytes(PLAN_KEY, parquet_bytes(plan.assignments))
        return old
    if old is not None and not new_output and has_committed(storage):
        changes = changed_components(old.components, new_info.components)
        raise FingerprintMismatch(
            f"{storage.uri}: run.json was made with {'; '.join(changes[:3]) or 'another run'}; "
            "use a new output or generation.new_output: true"
        )
    if old is not None:
        supersede(storage, old.fingerprint)
    # The plan first: a run.json always has its plan next to it.
    storage.write_bytes(PLAN_KEY, parquet_bytes(plan.assignments))
    storage.write_bytes(RUN_KEY, new_info.to_json())
    return new_info


def has_committed(storage: Storage) -> bool:
    """Whether any shard is committed at the root. A root whose run committed nothing (a canary
    stop, a crash before the first shard) holds no run's data: another config may take it
    over, its leftovers (canary rows, run.json) moved under superseded/, never reused."""
    return any(parse_manifest_key(k) is not None for k in storage.list(SHARDS_PREFIX))


def supersede(storage: Storage, old_fingerprint: str) -> None:
    """Move every key of the old run under superseded/<fingerprint>/, run.json last."""
    # The lease is the output's, not the old run's: the run superseding it holds it now.
    keys = [k for k in storage.list() if not k.startswith((SUPERSEDED_PREFIX, LEASE_PREFIX))]
    target = superseded_prefix(old_fingerprint)
    for key in keys:
        storage.write_bytes(target + key, storage.read_bytes(key))
    for key in sorted(keys, key=lambda k: k == RUN_KEY):
        storage.delete(key)
