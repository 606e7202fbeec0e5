"""How a dataset was made, in one machine-readable file: `report/provenance.json`.

Everything a published card shows is here too, so a trainer's pipeline checks the data it is
given (the target model and its revision, the engine and its version, the sampling and its
mix, the chat template's hash, the prompt source at its commit, the audit's verdict and
figures) without parsing Markdown. Two kinds of facts go in: what only the run knows
(`RunFacts`: the engine it served with, the template the servers rendered), recorded as the run
ends; and what the dataset says of itself (run.json, the audit, the counts), read again by
`regen publish` so the file never disagrees with the report beside it. No timestamp of its
own: rewritten with the same facts it is the same bytes, so a second publish uploads nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from regen.audit import AuditResult
from regen.audit.result import Quantiles
from regen.config import EngineConfig, RegenConfig
from regen.dataset import read_run
from regen.dataset.keys import PROVENANCE_KEY
from regen.dataset.rejects import read_rejects
from regen.errors import UserError
from regen.lossmask.template import template_source
from regen.storage import Storage

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Bumped when a key changes meaning; a reader checks it before trusting the rest."""


class ModelFacts(BaseModel):
    """The target model the answers came from."""

    served_name: str | None = Field(description="The name the servers served it under.")
    source: str | None = Field(description="Where it was staged from: a directory, s3:// or hf://.")
    revision: str | None = Field(
        description="The Hub revision asked for; None: the default branch."
    )
    chat_template_sha256: str | None = Field(
        default=None,
        description="sha256 of the chat template text the servers rendered prompts with "
        "(chat_template.jinja or tokenizer_config.json's); None when not known.",
    )
    chat_template_file: str | None = Field(
        default=None, description="The file that template was read from (its name only)."
    )


class EngineFacts(BaseModel):
    """The serving engine that generated the answers."""

    kind: str = Field(description="sglang, emulator (a rehearsal) or external servers.")
    version: str | None = Field(description="The engine's version; None when not known.")
    reasoning_parser: str | None = Field(description="SGLang's --reasoning-parser.")
    tool_call_parser: str | None = Field(description="SGLang's --tool-call-parser.")
    speculative: str | None = Field(
        description="The speculative decoding algorithm the servers ran (it changes no token "
        "distribution), None when off."
    )


class RunFacts(BaseModel):
    """What only the run knows, recorded as it ends; kept as they are by `regen publish`."""

    model: ModelFacts
    engine: EngineFacts
    regen_version: str = Field(description="The regen that made the dataset.")


class PromptFacts(BaseModel):
    """The prompt set the answers were generated for."""

    input_path: str | None = Field(
        description="As run.json records it, a Hub set pinned to its commit."
    )
    format: str | None = Field(description="The rows' format, or `mixed`.")
    source: dict[str, Any] = Field(
        default_factory=dict,
        description="A Hub prompt set's repo, revision, commit and files (run.json's `source`).",
    )
    revisions: int = Field(description="Input revisions the dataset holds (scheduled reruns).")
    license: str | None = Field(
        default=None, description="The license the prompt source's card declares, if any."
    )


class RowFacts(BaseModel):
    """How many rows there are, and of what kind."""

    planned: int | None = Field(description="Ids the plan holds (valid input rows).")
    committed: int = Field(description="Rows in committed shards.")
    ok: int = Field(description="Committed rows with an answer (what is published).")
    error_rows: int = Field(description="Committed rows that ended in an error (never published).")
    rejected: int | None = Field(description="Input rows rejected before planning (rejects/).")


class CheckFigure(BaseModel):
    """One audit check as the gate graded it."""

    name: str
    title: str
    status: str
    figure: float | None
    warn: float | None = None
    fail: float | None = None


class AuditFacts(BaseModel):
    """The audit's verdict over the dataset and every check's figure."""

    verdict: str
    gate: str
    rows: int
    checks: list[CheckFigure]
    lengths: dict[str, Quantiles] = Field(
        default_factory=dict, description="p1 / p50 / p99 of each length column, in tokens."
    )


class Provenance(BaseModel):
    """report/provenance.json."""

    schema_version: int = SCHEMA_VERSION
    dataset: str = Field(description="The dataset root it describes.")
    fingerprint: str | None = Field(description="run.json's fingerprint of model and sampling.")
    created: str | None = Field(description="When run.json was first written.")
    model: ModelFacts
    engine: EngineFacts | None = Field(
        description="None: not recorded (a dataset whose run ended before regen recorded it)."
    )
    regen_version: str | None
    sampling: dict[str, Any] = Field(description="run.json's sampling section, its mix included.")
    regeneration: dict[str, Any] = Field(description="turns, thinking and their mixes.")
    prompts: PromptFacts
    rows: RowFacts
    audit: AuditFacts

    def run_facts(self) -> RunFacts | None:
        if self.engine is None or self.regen_version is None:
            return None
        return RunFacts(model=self.model, engine=self.engine, regen_version=self.regen_version)

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()


def regen_version() -> str:
    return importlib.metadata.version("regen")


def run_facts(config: RegenConfig, tokenizer: str | Path | None) -> RunFacts:
    """What the run served with: the engine's version (asked of its venv) and the hash of the
    chat template of the model directory its tokenizer came from."""
    model = config.model
    sha, name = template_hash(tokenizer)
    engine = config.engine
    speculative = engine.speculative.algorithm if engine.speculative.enabled else None
    return RunFacts(
        model=ModelFacts(
            served_name=model.served_name,
            source=model.source,
            revision=model.revision,
            chat_template_sha256=sha,
            chat_template_file=name,
        ),
        engine=EngineFacts(
            kind=engine.kind,
            version=engine_version(engine),
            reasoning_parser=engine.reasoning_parser,
            tool_call_parser=engine.tool_call_parser,
            speculative=speculative if engine.kind == "sglang" else None,
        ),
        regen_version=regen_version(),
    )


def template_hash(tokenizer: str | Path | None) -> tuple[str | None, str | None]:
    """sha256 of the model directory's chat template text and the file it is in."""
    if tokenizer is None:
        return None, None
    path = Path(tokenizer)
    found = template_source(path if path.is_dir() else path.parent)
    if found is None:
        return None, None
    file, text = found
    return hashlib.sha256(text.encode()).hexdigest(), file.name


def engine_version(engine: EngineConfig) -> str | None:
    """sglang's version in `engine.python`'s venv (its metadata, not an import: seconds
    cheaper); the emulator says which SGLang it answers as; external servers are not ours."""
    if engine.kind == "emulator":
        from regen.emulator.wire import VERSION

        return f"regen {regen_version()} emulating sglang {VERSION}"
    if engine.kind != "sglang":
        return None
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        done = subprocess.run(
            [engine.python, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("sglang's version not recorded: %s: %s", engine.python, err)
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def read_provenance(storage: Storage) -> Provenance | None:
    """The dataset's provenance; None when it has none or one of another schema."""
    try:
        data = json.loads(storage.read_bytes(PROVENANCE_KEY))
        found = Provenance.model_validate(data)
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as err:
        log.warning("%s/%s unreadable, made again: %s", storage.uri, PROVENANCE_KEY, err)
        return None
    return found if found.schema_version == SCHEMA_VERSION else None


def build_provenance(
    storage: Storage,
    audit: AuditResult,
    facts: RunFacts | None,
    *,
    license: str | None = None,
    tokenizer: str | Path | None = None,
) -> Provenance:
    """The provenance of the dataset at `storage` as its run.json and `audit` describe it,
    with the run's own `facts` (None: not recorded; the model is then run.json's, its chat
    template's hash `tokenizer`'s when given)."""
    run = read_run(storage)
    if not run:
        raise UserError(f"{storage.uri}: no run.json: not a regen dataset")
    recorded: dict[str, Any] = run["model"] if isinstance(run.get("model"), dict) else {}
    model = (
        facts.model
        if facts is not None
        else ModelFacts(
            served_name=recorded.get("served_name"),
            source=recorded.get("source"),
            revision=recorded.get("revision"),
            chat_template_sha256=template_hash(tokenizer)[0],
            chat_template_file=template_hash(tokenizer)[1],
        )
    )
    rejects = read_rejects(storage)
    committed = audit.rows - audit.uncommitted
    return Provenance(
        dataset=storage.uri,
        fingerprint=run.get("fingerprint"),
        created=run.get("created"),
        model=model,
        engine=facts.engine if facts else None,
        regen_version=facts.regen_version if facts else None,
        sampling=run.get("sampling") or {},
        regeneration=run.get("regeneration") or {},
        prompts=PromptFacts(
            input_path=run.get("input_path"),
            format=run.get("format"),
            source=run.get("source") or {},
            revisions=len(run.get("revisions") or []) or 1,
            license=license,
        ),
        rows=RowFacts(
            planned=audit.planned,
            committed=committed,
            ok=committed - audit.failed_rows,
            error_rows=audit.failed_rows,
            rejected=rejects.height if rejects is not None else None,
        ),
        audit=AuditFacts(
            verdict=audit.verdict,
            gate=audit.gate,
            rows=audit.rows,
            checks=[
                CheckFigure(
                    name=c.name,
                    title=c.title,
                    status=c.status,
                    figure=c.figure,
                    warn=c.warn,
                    fail=c.fail,
                )
                for c in audit.checks
            ],
            lengths=audit.lengths,
        ),
    )


def write_provenance(storage: Storage, provenance: Provenance) -> bool:
    """Write report/provenance.json unless it already holds these bytes; whether it wrote."""
    data = provenance.to_json()
    try:
        if storage.read_bytes(PROVENANCE_KEY) == data:
            return False
    except FileNotFoundError:
        pass
    storage.write_bytes(PROVENANCE_KEY, data)
    return True


def source_license(source: dict[str, Any], token: str | None = None) -> str | None:
    """The license a Hub prompt source's card declares at the commit the run read (its
    `README.md`, from huggingface_hub's cache when the run fetched it); None for a source that
    is not on the Hub, a card without one, or a card that cannot be read (said in the log)."""
    repo, commit = source.get("repo"), source.get("commit")
    if not isinstance(repo, str) or not isinstance(commit, str):
        return None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.repocard import metadata_load

    from regen.hub_errors import hub_errors
    from regen.prompts.hub import CARD

    try:
        with hub_errors(f"hf://datasets/{repo}", commit, token):
            path = hf_hub_download(repo, CARD, repo_type="dataset", revision=commit, token=token)
        found = metadata_load(path) or {}
    except (UserError, ValueError) as err:
        log.warning("the prompt source's license was not read: %s", err)
        return None
    value = found.get("license")
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) and value else None


def refresh_provenance(
    storage: Storage,
    audit: AuditResult,
    *,
    facts: RunFacts | None = None,
    tokenizer: str | Path | None = None,
    token: str | None = None,
) -> Provenance:
    """The dataset's provenance brought up to its current audit, and written when it changed
    (or was missing): the run's facts are `facts`, else those already recorded. A dataset
    this user may only read still gets its provenance published; its absence is logged."""
    existing = read_provenance(storage)
    if facts is None and existing is not None:
        facts = existing.run_facts()
    run = read_run(storage)
    license = source_license(run.get("source") or {}, token)
    if license is None and existing is not None:
        license = existing.prompts.license
    found = build_provenance(storage, audit, facts, license=license, tokenizer=tokenizer)
    try:
        write_provenance(storage, found)
    except (OSError, UserError) as err:
        log.warning("%s not written: %s", PROVENANCE_KEY, err)
    return found
