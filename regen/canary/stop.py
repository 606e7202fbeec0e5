"""The record a stopped run leaves, and the refusal of a rerun that would stop the same way.

A run the live gate stopped would stop again if rerun unchanged, after renting the GPUs and
sending the canary once more; so the rerun is refused before anything starts, with the reason
the last run stopped. A rerun goes on when the config changed (a new fingerprint: the old
record no longer speaks for it) or when the user says the cause is fixed outside the config
(`generation.new_output`, e.g. a repaired chat template or model upload): then the record and
the old canary rows are set aside, kept but never reused, and the canary is sent afresh.
A stop on the input's rejects (`judge_input`, before any row is generated) is not refused:
judging it again costs nothing. `stopped_run` hands the record and the canary's rows to the
final audit, which judges the run on every row it generated.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

import polars as pl
from pydantic import BaseModel, Field

from regen.audit.final import StoppedRun
from regen.audit.rejects import rejects_check
from regen.audit.result import FailingFigure, figure_lines, short_figures
from regen.audit.rolling import Finding
from regen.canary.store import read_canary
from regen.config import AuditConfig
from regen.dataset.keys import STOP_KEY, canary_key, set_aside_prefix
from regen.errors import UserError
from regen.storage import Storage


class RunStopped(UserError):
    """The last run on this output stopped at its live gate and nothing has changed since."""


class StopRecord(BaseModel):
    """Why a run stopped: the failing checks with their figures and example ids.

    `stage` is `canary` when the sample failed before the plan was sent, `rolling` when the
    running figures of committed shards crossed a fail threshold.
    """

    fingerprint: str
    stage: Literal["canary", "rolling"]
    rows_audited: int
    prompts_sent: int
    prompts_planned: int
    checks: list[Finding] = Field(min_length=1)
    canary: str | None = Field(default=None, description="Key of the kept canary rows.")
    stopped_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def reason(self) -> str:
        """One line: each failing check with its figure, threshold and a few example ids
        (the details are in the record and the report)."""
        where = "at the canary" if self.stage == "canary" else "in its rolling audit"
        return f"stopped {where} {self._after()}: {'; '.join(self.check_lines())}"

    def gate_line(self) -> str:
        """The stop as every gate failure says it after `FAIL:` (`regen.audit.result`):
        `canary gate stopped the run after 256 rows: empty_answer 87.1 % (fail at 5.00 %)...`."""
        return f"{self.stage} gate stopped the run {self._after()}: {'; '.join(self.check_lines())}"

    def headline(self) -> str:
        """The stop in short, for the first line of a failed state's message (a UI shows some
        70 characters of it): `canary gate stopped the run after 256 rows: empty_answer
        87.1 % (+4 more)`."""
        short = short_figures(self._figures())
        return f"{self.stage} gate stopped the run {self._after()}: {short}"

    def check_lines(self) -> list[str]:
        """One line per failing check: its figure, its threshold, and example ids said once
        (`regen.audit.result.figure_lines`)."""
        return figure_lines(self._figures())

    def _after(self) -> str:
        # The input's rejects are judged before any row is generated.
        return f"after {self.rows_audited:,} rows" if self.rows_audited else "before generating"

    def _figures(self) -> list[FailingFigure]:
        return [
            (
                check.check,
                check.figure,
                check.fail,
                # Its rows are the input's, not generated ones.
                f" ({round(check.figure * check.rows):,} of {check.rows:,} input rows)"
                if check.check == "rejects"
                else "",
                check.examples,
            )
            for check in self.checks
        ]


def write_stop_record(storage: Storage, record: StopRecord) -> str:
    """Write `report/stopped.json`; the key written."""
    storage.write_bytes(STOP_KEY, record.model_dump_json(indent=2).encode())
    return STOP_KEY


def read_stop_record(storage: Storage) -> StopRecord | None:
    try:
        data = storage.read_bytes(STOP_KEY)
    except FileNotFoundError:
        return None
    return StopRecord.model_validate_json(data)


def judge_input(
    storage: Storage,
    fingerprint: str,
    rejects: pl.DataFrame,
    usable: int,
    config: AuditConfig,
) -> StopRecord | None:
    """The live gate's first look, before any prompt is sent: the share of input rows
    rejected (the audit's rejects check). Over its fail threshold under `audit.live: stop`, the run
    stops here: the record is written and returned. None otherwise (under `warn` the final
    audit still fails on it)."""
    check = rejects_check(rejects, usable, config)
    if config.live != "stop" or check.status != "fail":
        return None
    assert check.figure is not None
    finding = Finding(
        check=check.name,
        title=check.title,
        figure=check.figure,
        fail=check.fail,
        rows=rejects.height + usable,
        examples=check.examples,
        detail=check.detail,
    )
    record = StopRecord(
        fingerprint=fingerprint,
        stage="canary",
        rows_audited=0,
        prompts_sent=0,
        prompts_planned=usable,
        checks=[finding],
    )
    write_stop_record(storage, record)
    return record


def stopped_run(storage: Storage) -> StoppedRun | None:
    """The stop of the last run on this root, with the canary rows it generated, for the
    final audit to judge (`regen.audit.final.run_audit`); None when it was not stopped."""
    record = read_stop_record(storage)
    if record is None:
        return None
    return StoppedRun(
        gate=record.stage,
        line=record.gate_line(),
        rows=read_canary(storage, record.fingerprint),
        headline=record.headline(),
        checks=tuple(record.check_lines()),
    )


def check_not_stopped(
    storage: Storage,
    fingerprint: str,
    *,
    new_output: bool = False,
    live: str = "stop",
    canary: bool = True,
) -> None:
    """Refuse an unchanged rerun of a stopped run; otherwise clear the way for this run.

    Raises `RunStopped` naming the checks that stopped the last run, when this run would be
    judged the same way: same fingerprint, `live` gate `stop`, and a `canary` if the canary
    stopped it (`generation.canary_prompts: 0` is the user's call to skip it). A record of
    another fingerprint, a stop on the input's rejects (judged again at no cost, so a fixed
    file or a looser threshold goes on), or any record this run is not refused by, is moved
    under `superseded/` with the canary rows of its fingerprint, so neither the report folder
    nor the next canary carries the stopped run's results.
    """
    record = read_stop_record(storage)
    if record is None:
        return
    # A stop before any row was generated (the input's rejects) cost nothing: judged again.
    judged_alike = live == "stop" and (canary or record.stage == "rolling")
    if (
        record.fingerprint == fingerprint
        and not new_output
        and judged_alike
        and record.rows_audited
    ):
        raise RunStopped(
            f"{storage.uri}: the last run {record.reason()}; rerunning unchanged would stop the "
            "same way: fix the cause and rerun with generation.new_output: true or a new output"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = set_aside_prefix(record.fingerprint, stamp)
    rows = canary_key(record.fingerprint)
    # Copies first, the record last: a crash midway leaves the record, and the next run
    # finishes setting it aside.
    kept = [key for key in (rows, STOP_KEY) if storage.exists(key)]
    for key in kept:
        storage.write_bytes(target + key, storage.read_bytes(key))
    for key in kept:  # deleting a missing key is fine locally and on S3 alike
        storage.delete(key)
