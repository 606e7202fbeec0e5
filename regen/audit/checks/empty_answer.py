"""Empty answers: empty, filler ('OK.') or too short to teach anything (the incident's 87 %)."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.dataset import answer_snippets
from regen.audit.features import answer_tokens, answered, blank, normalised_answer
from regen.audit.result import Check
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Hits, Summary
from regen.config import AuditConfig


class EmptyAnswer(FlagCheck):
    name = "empty_answer"
    title = "empty/trivial answers"
    threshold = "empty_answer"
    detail = "have an empty, filler or trivial answer"

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        """The kind of empty answer (empty, filler, short), null for a real one."""
        fillers = sorted({" ".join(f.lower().split()) for f in config.filler_answers})
        kind = (
            pl.when(~answered())
            .then(None)
            # A tool call is the turn's answer (regen.tools): its content is empty by design.
            .when(pl.col("finish_reason") == "tool_calls")
            .then(None)
            .when(blank("content"))
            .then(pl.lit("empty"))
            .when(normalised_answer().is_in(fillers))
            .then(pl.lit("filler"))
            .when(answer_tokens() < config.min_answer_tokens)
            .then(pl.lit("short"))
        )
        return [kind.alias(self.name)]

    def hit(self, config: AuditConfig) -> pl.Expr:
        return pl.col(self.name).is_not_null()

    def reason(self, config: AuditConfig) -> pl.Expr:
        return (
            pl.when(pl.col(self.name) == "short")
            .then(pl.format("short: {} tokens", pl.col("answer_tokens")))
            .otherwise(pl.col(self.name))
        )

    def amend(self, hits: Hits, rows: pl.LazyFrame) -> Hits:
        """A filler example shows its answer: `filler: 'OK.'`."""
        fillers = answer_snippets(rows, [e.id for e in hits.examples if e.reason == "filler"])
        for e in hits.examples:
            if e.id in fillers:
                e.reason = f"filler: {fillers[e.id]!r}"
        return hits

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        check = super().grade(summary, settings)
        if summary.completions:
            kinds = summary.empty_kinds
            check.detail += (
                f" (empty {kinds.get('empty', 0)}, filler {kinds.get('filler', 0)}, "
                f"under {settings.config.min_answer_tokens} tokens {kinds.get('short', 0)})"
            )
        return check


CHECK = EmptyAnswer()
