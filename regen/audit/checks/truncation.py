"""Truncation: cut off by max_tokens (finish_reason length)."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.features import answered
from regen.config import AuditConfig


def cut_off() -> pl.Expr:
    """The row stopped at max_tokens."""
    return pl.col("finish_reason") == "length"


class Truncation(FlagCheck):
    name = "truncation"
    title = "truncation"
    threshold = "truncated"
    detail = "stopped at max_tokens (finish_reason length)"

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        return [(answered() & cut_off()).alias(self.name)]

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.lit("finish_reason length")


CHECK = Truncation()
