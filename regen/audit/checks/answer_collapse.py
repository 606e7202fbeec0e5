"""Answer collapse: the share of the single most common (normalised) answer."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import AuditCheck
from regen.audit.result import Check, Example, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Summary


class AnswerCollapse(AuditCheck):
    name = "answer_collapse"
    title = "answer collapse"
    threshold = "answer_collapse"

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        """Ties go to the answer seen first."""
        ok = summary.completions
        if ok == 0:
            return skipped(self.name, self.title, "no completions")
        answers = summary.answers
        top_n, ids, snippet = 0, [], ""
        if answers.counts.height:
            top = answers.counts.sort("n", descending=True, maintain_order=True).row(0, named=True)
            top_n, snippet = top["n"], top["snippet"]
            ids = answers.ids.filter(pl.col("key") == top["key"])["id"].to_list()
        # A "most common" answer seen once is no collapse: nothing to show.
        shown = ids if top_n > 1 else []
        return graded(
            self.name,
            self.title,
            top_n / ok,
            self.limit(settings.config),
            # Not even among 4 rows: 1 of 4 is 25 %, over the default fail threshold.
            status=None if top_n > 1 else "pass",
            examples=[Example(id=i, reason=f"answer {snippet!r}") for i in shown],
            # The answer itself is shown only in the report's examples: model output can echo
            # the prompt, and the detail goes to logs.
            detail=f"most common answer on {top_n:,} of {ok:,} completions",
        )


CHECK = AnswerCollapse()
