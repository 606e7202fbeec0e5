"""Tiny-length mode: a large share of rows at nearly the same tiny length.

A healthy generation has smooth length distributions; a template or parser bug shows as
a large share of rows at nearly the same tiny length (the incident: 6 tokens). The lengths
(`regen.audit.lengths`) are value counts of integers, so quantiles stay exact over merged
shards.
"""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import AuditCheck
from regen.audit.lengths import length_columns, length_quantiles
from regen.audit.result import Check, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Summary
from regen.config import AuditConfig
from regen.display.figures import count


class TinyLength(AuditCheck):
    name = "tiny_length"
    title = "tiny-length mode"
    threshold = "tiny_length"

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        """The worst share of completions at or under `tiny_length_tokens`, over the length
        columns."""
        if summary.completions == 0:
            return skipped(self.name, self.title, "no completions")
        config = settings.config
        columns = length_columns(settings.thinking)
        lengths = length_quantiles(summary, columns)
        shares = {
            c: (summary.tiny[c].n if c in summary.tiny else 0)
            / max(sum(summary.lengths.get(c, {}).values()), 1)
            for c in columns
        }
        worst = max(shares, key=lambda c: shares[c])
        rate = float(shares[worst])
        p50 = ", ".join(f"{c} {count(q.p50)}" for c, q in lengths.items())
        over = [f"{c} {v:.1%}" for c, v in shares.items() if v > 0]
        return graded(
            self.name,
            self.title,
            rate,
            self.limit(config),
            examples=[e.model_copy() for e in summary.tiny[worst].examples] if rate else [],
            detail=f"share at <= {config.tiny_length_tokens} tokens: {', '.join(over) or 'none'}; "
            f"p50: {p50}",
        )

    def server_flags(self, config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
        return {"tiny_answer": pl.col("answer_tokens") <= config.tiny_length_tokens}


CHECK = TinyLength()
