"""Aborted answers: a turn the server cut short (finish_reason abort) stored as an answer.

SGLang answers a request it cut (an abort, a paused engine, a scheduler's own limit) with a
200 whose text stops wherever the cut fell (regen.sglang_api.abort). The dispatcher retries
such an answer and never stores it, so one here is a dataset made without that rule or a
bug; a trainer would learn the cut, so one is too many (its threshold is 0 by default).
"""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.features import answered
from regen.config import AuditConfig


class Aborted(FlagCheck):
    name = "aborted"
    title = "aborted answers"
    threshold = "aborted"
    detail = "were cut short by the server (finish_reason abort)"
    reads_answers = False  # a finish reason, not the text: judged in a dress rehearsal too

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        return [
            (answered() & (pl.col("finish_reason") == "abort")).fill_null(False).alias(self.name)
        ]

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.lit("finish_reason abort")


CHECK = Aborted()
