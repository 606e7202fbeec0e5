"""What a check is: a name, a title, the `AuditConfig` field it is graded against, and how it
grades a summary's figures; and a row flag, the common kind, that also says how a row is
measured (polars expressions, row-wise, so the scan streams).
"""

from __future__ import annotations

from typing import ClassVar

import polars as pl

from regen.audit.result import Check, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Hits, Summary
from regen.config import AuditConfig, Threshold
from regen.config.audit import RowCheck


class AuditCheck:
    """A check graded from a summary's figures (one shard's, a canary's, or merged)."""

    name: ClassVar[RowCheck]
    title: ClassVar[str]
    threshold: ClassVar[str | None]
    """The `AuditConfig` field (a `Threshold`) its figure is graded against; None where the
    threshold is another check's (per_setting grades each defect with its own)."""
    live: ClassVar[bool] = True
    """The live gate may stop a run on it; server_outlier is answered by quarantine instead."""
    reads_answers: ClassVar[bool] = True
    """It judges what the answers say: a dress rehearsal's random text fails it by design, so
    there it is measured and not judged (`regen.rehearsal.dress`)."""

    def limit(self, config: AuditConfig) -> Threshold:
        found = getattr(config, self.threshold or "")
        assert isinstance(found, Threshold), self.threshold
        return found

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        raise NotImplementedError

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        """The rows its figure is a share of, for the live gate's evidence; None for a figure
        that is not a sample of the run (judged as it is)."""
        return summary.completions

    def server_flags(self, config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
        """Per-row defects the per-server table counts over completions (`regen.audit.servers`),
        over the facts frame."""
        return {}


class FlagCheck(AuditCheck):
    """A defect a row has or has not: measured per answered turn, counted into the summary's
    `flags` under its name, per server and per setting, and graded as a share of completions.

    `facts` are row-wise expressions over a row of `row_schema()` (error rows included: guard
    with `answered()`), added to the facts frame; `batch_facts` measures what needs more than
    one row's expression (the repetition check's n-gram counts), per batch of the scan."""

    detail: ClassVar[str]
    """What a hit is, after `<n> of <m> completions`."""
    per_server: ClassVar[bool] = True
    per_setting: ClassVar[bool] = True
    needs_thinking: ClassVar[bool] = False
    """Only rows that asked for thinking can have it: not counted per server or per setting
    when the run stores no reasoning."""

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        return []

    def batch_facts(self, batch: pl.DataFrame, config: AuditConfig) -> list[pl.Series]:
        return []

    def hit(self, config: AuditConfig) -> pl.Expr:
        """Whether a row of the facts frame has the defect."""
        return pl.col(self.name)

    def reason(self, config: AuditConfig) -> pl.Expr:
        """An example's reason, over the facts frame."""
        raise NotImplementedError

    def amend(self, hits: Hits, rows: pl.LazyFrame) -> Hits:
        """The hits with examples made readable from the rows' texts, which the facts frame
        no longer holds."""
        return hits

    def describe(self, config: AuditConfig) -> str:
        return self.detail

    def of(self, summary: Summary) -> int:
        """The completions its figure is a share of."""
        return summary.completions

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        ok = self.of(summary)
        if ok == 0:
            return skipped(self.name, self.title, "no completions")
        hits = summary.flags.get(self.name, Hits())
        return graded(
            self.name,
            self.title,
            hits.n / ok,
            self.limit(settings.config),
            examples=[e.model_copy() for e in hits.examples],
            detail=f"{hits.n:,} of {ok:,} completions {self.describe(settings.config)}",
        )

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        return self.of(summary)

    def counted(self, thinking: bool) -> bool:
        return thinking or not self.needs_thinking

    def server_flags(self, config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
        return {self.name: self.hit(config)} if self.per_server and self.counted(thinking) else {}
