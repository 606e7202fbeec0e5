"""`run_audit`: the final gate, a merge of the shards' summaries plus the dataset-level checks.

Each committed shard's summary is read from beside its manifest, or computed from that shard
alone (one shard in memory) and written there when it is missing or was made with other
settings or from other data; a second audit is then a merge only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl
from pydantic import ValidationError

from regen.audit.by_setting import setting_breakdown
from regen.audit.completeness import completeness_check
from regen.audit.dataset import DatasetView, open_dataset
from regen.audit.lengths import histograms, length_columns, length_quantiles
from regen.audit.registry import CHECKS
from regen.audit.rejects import rejects_check
from regen.audit.result import AuditResult, Check, verdict_of
from regen.audit.servers import server_breakdown
from regen.audit.settings import AuditSettings, settings_for
from regen.audit.summary import audit_rows, merge
from regen.audit.summary_model import Summary
from regen.config import AuditConfig
from regen.dataset.keys import summary_key
from regen.dataset.rejects import read_rejects
from regen.storage import Storage

_FOLD = 200
"""Summaries merged at a time while reading: bounds memory, costs a few merges of the
running figures."""


@dataclass(frozen=True)
class StoppedRun:
    """A run the live gate stopped (`regen.canary.stopped_run` reads it from the root)."""

    gate: Literal["canary", "rolling"]
    line: str
    """The gate's verdict in one line: `canary gate stopped the run after 256 rows: ...`."""
    rows: pl.DataFrame
    """Rows it generated outside committed shards (the canary's): judged with the rest."""
    headline: str = ""
    """The stop in short: `canary gate stopped the run after 256 rows: empty_answer 87.1 %
    (+4 more)`."""
    checks: tuple[str, ...] = ()
    """Its failing checks, one line each, each example id said once."""


def run_audit(
    storage: Storage,
    config: AuditConfig,
    *,
    thinking_requested: bool | None = None,
    tokenizer_path: Path | str | None = None,
    stopped: StoppedRun | None = None,
) -> AuditResult:
    """Audit the committed shards under `storage`; only shard summaries are written (the
    report is `write_report`'s).

    `thinking_requested` defaults to run.json's `regeneration.thinking` being `save`.
    `tokenizer_path` is the model directory (or its tokenizer.json) whose chat template
    rebuilds the loss mask of turns stored without token ids and is checked against the
    stored prompts; without it and without ids, those checks are `skipped`, never passed.
    `stopped`: the live gate stopped the run; every check is computed over the rows that
    exist (its canary rows of uncommitted shards too) and the verdict is a fail naming it.
    """
    view = open_dataset(storage)
    settings = settings_for(
        storage, view, config, thinking_requested=thinking_requested, tokenizer_path=tokenizer_path
    )
    # Duplicate and missing ids span shards: the one check that reads ids across the dataset.
    # It runs first and its frames are gone before the summaries are merged, so the two peaks
    # (some 200 MB each at a million rows) do not add up.
    completeness = completeness_check(view.scan().select("id", "shard").collect(), view, config)
    # Folded as they come, so memory holds one running merge, not every shard's summary.
    running: list[Summary] = []
    for summary in iter_shard_summaries(storage, view, settings, computed=[]):
        running.append(summary)
        if len(running) >= _FOLD:
            running = [merge(running)]
    uncommitted = _uncommitted(stopped, view)
    if uncommitted.height:
        # Summarised, never stored: these rows are in no shard (yet).
        running.append(audit_rows(uncommitted, settings))
    summary = merged(running, settings)
    usable = view.plan.height if view.plan is not None else summary.rows
    result = audit_result(
        summary,
        settings,
        dataset=storage.uri,
        planned=view.plan.height if view.plan is not None else None,
        completeness=completeness,
        rejects=rejects_check(read_rejects(storage), usable, config),
    )
    if stopped is not None:
        result.stopped, result.gate, result.uncommitted = (
            stopped.line,
            stopped.gate,
            uncommitted.height,
        )
        result.stop_headline, result.stop_checks = stopped.headline or None, [*stopped.checks]
        result.verdict = "fail"
    return result


def _uncommitted(stopped: StoppedRun | None, view: DatasetView) -> pl.DataFrame:
    """A stopped run's rows that no committed shard holds (and the view does not drop)."""
    if stopped is None:
        return pl.DataFrame()
    rows = stopped.rows.filter(~pl.col("shard").is_in(list(view.committed)))
    return rows.filter(~pl.col("id").is_in(list(view.dropped))) if view.dropped else rows


def iter_shard_summaries(
    storage: Storage, view: DatasetView, settings: AuditSettings, computed: list[int]
) -> Iterator[Summary]:
    """Read each shard's stored summary; compute (one shard in memory) and store the ones
    missing, made with other settings, or made from another generation of the shard's data,
    appending their shard numbers to `computed`."""
    key = settings.key
    for shard in view.committed:
        source = view.source(shard)
        summary = read_summary(storage, shard, key)
        if summary is None or summary.sources != {shard: source}:
            rows = view.scan([shard]).collect()
            summary = audit_rows(rows, settings, sources={shard: source})
            storage.write_bytes(summary_key(shard, key), summary.to_json())
            computed.append(shard)
        yield summary


def read_summary(storage: Storage, shard: int, settings: str) -> Summary | None:
    """The stored summary, or None when there is none or it is unreadable (then recomputed)."""
    key = summary_key(shard, settings)
    try:
        return Summary.model_validate_json(storage.read_bytes(key))
    except (FileNotFoundError, ValidationError):
        return None


def merged(parts: list[Summary], settings: AuditSettings) -> Summary:
    """The merge, or an empty summary when nothing is committed."""
    if not parts:
        return Summary(settings=settings.key, max_examples=settings.config.max_examples)
    return merge(parts)


def row_checks(summary: Summary, settings: AuditSettings) -> list[Check]:
    """Every check of the registry, in its order, from a summary: the final gate's and the
    live gate's (completeness and rejects are the final audit's own)."""
    checks = [check.grade(summary, settings) for check in CHECKS]
    return [_not_judged(c) if c.name in settings.config.not_judged else c for c in checks]


def _not_judged(check: Check) -> Check:
    """Measured, shown, never graded: no threshold, so no gate acts on it."""
    detail = f"not judged (audit.not_judged): {check.detail}"
    update = {"status": "skipped", "warn": None, "fail": None, "detail": detail}
    return check.model_copy(update=update)


def audit_result(
    summary: Summary,
    settings: AuditSettings,
    *,
    dataset: str,
    planned: int | None,
    completeness: Check,
    rejects: Check,
) -> AuditResult:
    """The AuditResult (audit.json, audit.md) of merged figures and the dataset-level checks."""
    columns = length_columns(settings.thinking)
    lengths = length_quantiles(summary, columns)
    plots = histograms(summary.lengths, columns) if summary.completions else {}
    if summary.loss.tokens:
        plots |= histograms({"loss_tokens": summary.loss.tokens}, ["loss_tokens"])
    checks = [rejects, completeness, *row_checks(summary, settings)]
    return AuditResult(
        dataset=dataset,
        rows=summary.rows,
        planned=planned,
        verdict=verdict_of(checks),
        checks=checks,
        lengths=lengths,
        histograms=plots,
        finish_reasons=dict(sorted(summary.finish_reasons.items())),
        servers=server_breakdown(summary.servers),
        per_setting=setting_breakdown(summary.by_setting),
    )
