"""Whether a dataset may leave: finished, whole, and judged fit by its own audit.

A published dataset is trusted by people who never saw the run, so each refusal is one line
naming what is wrong and what to do: a run the live gate stopped, one with planned shards not
yet committed, an audit older than the data, a failed audit (unless the user says otherwise).
Exit codes as every verb's: 2 when the dataset cannot be judged here (not a dataset, never
audited), 1 when it was judged unfit.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from regen.audit import AuditResult
from regen.canary.stop import read_stop_record
from regen.dataset import (
    AUDIT_REPORT_KEY,
    Committed,
    read_committed,
    read_run,
    require_dataset,
    view_plan,
)
from regen.errors import UsageError, UserError
from regen.storage import Storage


@dataclass(frozen=True)
class Finished:
    """A dataset fit to publish: its committed shards and the audit that judged them."""

    committed: Committed
    audit: AuditResult


def require_finished(storage: Storage, *, allow_failed: bool = False) -> Finished:
    """The dataset at `storage` if it may be published; else a UserError saying why."""
    uri = storage.uri.rstrip("/")
    committed = read_committed(storage)
    require_dataset(storage, committed)
    if not read_run(storage):
        raise UsageError(f"{uri}: no run.json: not a regen dataset")
    stop = read_stop_record(storage)
    if stop is not None:
        raise UserError(
            f"{uri}: stopped by the live gate ({stop.headline()}): a stopped run is not "
            "published; fix the cause, rerun it to the end, then publish"
        )
    audit = read_audit(storage)
    if audit is None:
        raise UsageError(
            f"{uri}: never audited (no {AUDIT_REPORT_KEY}): run `regen audit {uri}` first"
        )
    if audit.stopped:
        raise UserError(f"{uri}: its audit judged a stopped run ({audit.stopped}): rerun it first")
    plan = view_plan(storage, committed)
    if plan is not None:
        planned = sorted(set(plan["shard"].unique().to_list()))
        missing = [s for s in planned if s not in committed.manifests]
        if missing:
            shown = ", ".join(str(s) for s in missing[:5]) + (" …" if len(missing) > 5 else "")
            raise UserError(
                f"{uri}: incomplete: {len(missing):,} of {len(planned):,} planned shards are "
                f"not committed (shards {shown}): run it again to finish, then publish"
            )
    rows = committed.rows - sum(
        len(committed.dropped_by_shard.get(s, ())) for s in committed.shards
    )
    if audit.rows - audit.uncommitted != rows:
        raise UserError(
            f"{uri}: the audit is older than the data ({audit.rows:,} rows audited, {rows:,} "
            f"committed): run `regen audit {uri}` again, then publish"
        )
    if audit.verdict == "fail" and not allow_failed:
        raise UserError(
            f"{uri}: its audit failed ({audit.headline()}): a failed dataset is not published "
            "unless --allow-failed"
        )
    return Finished(committed, audit)


def read_audit(storage: Storage) -> AuditResult | None:
    """The last audit's result (report/audit.json), None when the dataset has none."""
    try:
        data = storage.read_bytes(AUDIT_REPORT_KEY)
    except FileNotFoundError:
        return None
    try:
        return AuditResult.model_validate_json(data)
    except ValidationError as err:
        raise UsageError(
            f"{storage.uri.rstrip('/')}/{AUDIT_REPORT_KEY}: unreadable ({err.error_count()} "
            "problems): run `regen audit` again"
        ) from None
