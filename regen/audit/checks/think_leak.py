"""Think-tag leakage: the reasoning parser missed a tag, so thinking leaks into the answer."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.features import answered
from regen.config import AuditConfig


class ThinkLeak(FlagCheck):
    name = "think_leak"
    title = "think-tag leakage"
    threshold = "think_leak"
    detail = "have a think tag in the answer or unbalanced tags in the reasoning"

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        reasoning = pl.col("reasoning_content").fill_null("")
        content = pl.col("content").fill_null("")
        leak = (
            content.str.contains("<think>", literal=True)
            | content.str.contains("</think>", literal=True)
            | (
                reasoning.str.count_matches("<think>", literal=True)
                != reasoning.str.count_matches("</think>", literal=True)
            )
        )
        return [(answered() & leak).alias(self.name)]

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.lit("<think> tag in content or unbalanced in reasoning")


CHECK = ThinkLeak()
