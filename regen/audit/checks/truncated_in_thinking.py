"""Truncated in thinking: the tokens ran out inside the thinking, so there is no answer at all."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.checks.truncation import cut_off
from regen.audit.features import answered, blank
from regen.config import AuditConfig


class TruncatedInThinking(FlagCheck):
    name = "truncated_in_thinking"
    title = "truncated in thinking"
    threshold = "truncated_in_thinking"
    detail = "ran out of tokens inside the thinking and have no answer"
    # The per-server table counts it under truncation.
    per_server = False

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        return [(answered() & cut_off() & blank("content")).alias(self.name)]

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.lit("finish_reason length, no answer")


CHECK = TruncatedInThinking()
