"""Error rows: they keep the dataset complete, but each is a sample the trainer never gets."""

from __future__ import annotations

from regen.audit.checks.base import AuditCheck
from regen.audit.result import Check, graded
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Summary


class ErrorRows(AuditCheck):
    name = "error_rows"
    title = "error rows"
    threshold = "error_rate"
    reads_answers = False

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        errors = summary.errors
        return graded(
            self.name, self.title, errors.n / max(summary.rows, 1), self.limit(settings.config),
            examples=[e.model_copy() for e in errors.examples],
            detail=f"{errors.n:,} of {summary.rows:,} rows are errors",
        )  # fmt: skip

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        return summary.rows


CHECK = ErrorRows()
