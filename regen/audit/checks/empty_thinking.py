"""Empty thinking: thinking was asked for, yet the reasoning is empty."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.features import answered, blank, thinks
from regen.audit.result import Check, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Summary
from regen.config import AuditConfig


class EmptyThinking(FlagCheck):
    name = "empty_thinking"
    title = "empty thinking"
    threshold = "empty_thinking"
    detail = "have no reasoning although thinking was requested"
    needs_thinking = True

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        # A row drawn to thinking off has no reasoning by design.
        return [(answered() & thinks() & blank("reasoning_content")).alias(self.name)]

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.lit("empty reasoning_content")

    def of(self, summary: Summary) -> int:
        # Over the rows that asked for thinking: none of a thinking_mix's off rows is counted.
        # A summary made before it was counted (every row thought) reads 0: all completions.
        return summary.thinking_completions or summary.completions

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        if not settings.thinking:
            why = "no reasoning stored by design (regeneration.thinking is drop or off)"
            return skipped(self.name, self.title, why)
        return super().grade(summary, settings)


CHECK = EmptyThinking()
