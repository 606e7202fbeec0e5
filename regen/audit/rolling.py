"""The rolling audit: the audit's own checks over running merged summaries, judged after each
shard (the live gate's half after the canary, `regen.generation.live_gate`).

A run that answers `OK.` to 87 % of prompts should stop after its first shards, not fail the
final gate days later. The gate merges each committed shard's summary into running figures
(never re-reading the dataset) and says: go on, stop (a check over its fail threshold with at
least `audit.live_min_rows` rows behind it), or quarantine a server whose answers are far
worse than the others' (the server_outlier check's test) while the run goes on with the rest.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from regen.audit.checks.server_outlier import server_outliers
from regen.audit.evidence import EVIDENCE, upper_tail
from regen.audit.final import row_checks
from regen.audit.registry import CHECKS
from regen.audit.result import Check, Example
from regen.audit.settings import AuditSettings
from regen.audit.summary import merge, merge_answers
from regen.audit.summary_model import Summary

GATE_ANSWERS = 10_000
"""Distinct answers the rolling audit keeps: a collapse is one answer on >= 5 % of rows, so it
is always among them; memory stays bounded over a million rows."""


def shown_over(rate: float, rows: int | None, fail: float) -> bool:
    """Whether `rate` of `rows` sampled rows shows a run at or over `fail` (`EVIDENCE`): the
    chance of at least that many bad rows from a run exactly at `fail` is under 5 %. Without
    `rows`, the rate is compared as it is."""
    if rate <= 0 or rate < fail:
        return False
    if rows is None or fail <= 0:
        return True
    bad = round(rate * rows)
    if fail >= 1:
        return bad >= rows
    return upper_tail(bad, rows, fail) < EVIDENCE


class Finding(BaseModel):
    """A check over its fail threshold, with what a report shows of it."""

    check: str
    title: str
    figure: float
    fail: float | None
    rows: int
    examples: list[Example] = Field(default_factory=list)
    detail: str = ""

    def line(self) -> str:
        fail = "" if self.fail is None else f" (fail at {self.fail:.1%})"
        return f"{self.check} {self.figure:.1%}{fail} over {self.rows:,} rows"


class Quarantine(BaseModel):
    """A server whose defect rate is far above the rest of the fleet's."""

    server: str
    defect: str
    rate: float
    rest: float
    examples: list[str] = Field(default_factory=list)

    def line(self) -> str:
        return f"{self.server} {self.defect} {self.rate:.1%} vs {self.rest:.1%} on the others"


class Decision(BaseModel):
    """What the gate says after a shard (or a canary): go on or stop, and servers to drop."""

    action: Literal["go", "stop"]
    policy: Literal["stop", "warn", "off"]
    failing: list[Finding] = Field(default_factory=list)
    """Checks over their fail threshold with enough rows behind them (reported under `warn`)."""
    quarantine: list[Quarantine] = Field(default_factory=list)
    """Servers to quarantine now (not those quarantined before)."""
    figures: dict[str, Any] = Field(default_factory=dict)
    """Compact running figures for progress.json and the progress artifact."""

    @property
    def reason(self) -> str:
        """One line for a state message or a log: what stopped the run, or what was dropped."""
        parts = [f.line() for f in self.failing] + [
            "quarantine " + q.line() for q in self.quarantine
        ]
        return "; ".join(parts) or "all checks within thresholds"


def judge(
    summary: Summary,
    settings: AuditSettings,
    min_rows: int | None = None,
    quarantined: frozenset[str] = frozenset(),
) -> Decision:
    """Judge the figures of one summary (a canary's, or the running merge of a run's shards).

    `min_rows` defaults to `audit.live_min_rows`. Servers already `quarantined` are neither
    named again nor blamed on the rest: their share of the rows is taken off each failing
    figure as if every one of their rows were a hit, so the rest of the fleet is stopped only
    on what it did itself.
    """
    config = settings.config
    policy = config.live
    checks = row_checks(summary, settings)
    figures = running_figures(summary, checks, quarantined)
    if policy == "off":
        return Decision(action="go", policy=policy, figures=figures)
    new = _quarantine(summary, settings, quarantined)
    dropped = quarantined | {q.server for q in new}
    share = sum(summary.servers.get(s, {}).get("rows", 0) for s in dropped) / max(summary.rows, 1)
    limit = config.live_min_rows if min_rows is None else min_rows
    failing = []
    for rule, check in zip(CHECKS, checks, strict=True):
        if not rule.live or check.figure is None or summary.rows < limit:
            continue
        healthy = max(0.0, check.figure - share) / (1 - share) if share < 1 else 0.0
        sampled = rule.sampled(summary, settings)
        rows = None if sampled is None else round(sampled * (1 - share))
        if check.fail is not None and shown_over(healthy, rows, check.fail):
            failing.append(_finding(check, summary.rows))
    stop = bool(failing) and policy == "stop"
    return Decision(
        action="stop" if stop else "go",
        policy=policy,
        failing=failing,
        quarantine=new,
        figures=figures,
    )


class RollingAudit:
    """The rolling audit: running merged figures of a run's committed shards, judged after
    each one."""

    def __init__(self, settings: AuditSettings, quarantined: frozenset[str] = frozenset()):
        self.settings = settings
        self.summary: Summary | None = None
        self.quarantined = set(quarantined)

    def update(self, shard: Summary) -> Decision:
        """Merge one committed shard's summary and judge the running figures."""
        # merge() copies: the caller's summary (stored, or reused) is never changed here.
        merged = merge([shard] if self.summary is None else [self.summary, shard])
        merged.answers = merge_answers([merged.answers], merged.max_examples, keep=GATE_ANSWERS)
        self.summary = merged
        decision = judge(merged, self.settings, quarantined=frozenset(self.quarantined))
        self.quarantined |= {q.server for q in decision.quarantine}
        return decision


def running_figures(
    summary: Summary, checks: list[Check], quarantined: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Rows, shards, each check's figure and status, and the quarantined servers: small
    enough to rewrite into progress.json after every shard."""
    return {
        "rows": summary.rows,
        "shards": len(summary.sources),
        "checks": {
            c.name: {"figure": c.figure, "status": c.status} for c in checks if c.figure is not None
        },
        "quarantined": sorted(quarantined),
    }


def _quarantine(
    summary: Summary, settings: AuditSettings, quarantined: frozenset[str]
) -> list[Quarantine]:
    """The worst outlier among the servers still in use, if its excess reaches the
    server_outlier check's fail threshold and at least one other server is left to carry the
    run."""
    config = settings.config
    counts = {s: c for s, c in summary.servers.items() if s not in quarantined}
    if len(counts) < 2 or "server_outlier" in config.not_judged:
        return []
    worst, _ = server_outliers(counts, config)
    if worst is None or worst.excess < config.server_outlier.fail:
        return []
    ids = summary.server_examples.get(worst.server, {}).get(worst.defect, [])
    found = Quarantine(
        server=worst.server, defect=worst.defect, rate=worst.rate, rest=worst.rest, examples=ids
    )
    return [found]


def _finding(check: Check, rows: int) -> Finding:
    assert check.figure is not None
    return Finding(
        check=check.name,
        title=check.title,
        figure=check.figure,
        fail=check.fail,
        rows=rows,
        examples=check.examples,
        detail=check.detail,
    )
