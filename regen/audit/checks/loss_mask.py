"""Loss-mask tokens: how many tokens a trainer learns from, per sample.

Measured by `regen.audit.loss_mask` (from the stored ids, else the model's chat template).
The check says how many samples came from each path, and is skipped, never passed, when
neither applies.
"""

from __future__ import annotations

from regen.audit.checks.base import AuditCheck
from regen.audit.lengths import quantile
from regen.audit.result import Check, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import LossFigures, Summary
from regen.config import AuditConfig
from regen.display.figures import count


class ShortLossMask(AuditCheck):
    name = "loss_mask"
    title = "loss-mask tokens"
    threshold = "loss_mask_short"

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        return loss_mask_check(summary.loss, settings.config, settings.model.missing)

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        return sum(summary.loss.tokens.values())


CHECK = ShortLossMask()


def loss_mask_check(found: LossFigures, config: AuditConfig, missing: str) -> Check:
    """The share of samples whose loss mask is at most `min_loss_tokens` tokens; skipped,
    never passed, when no answer could be measured (`missing` says why)."""
    name, title = CHECK.name, CHECK.title
    measured = sum(found.tokens.values())
    if measured == 0:
        detail = (
            "no completions"
            if found.turns == 0
            else f"no token ids stored in {found.turns} answers and {missing}: loss mask "
            "not measured"
        )
        return skipped(name, title, detail)
    limit = config.min_loss_tokens
    rate = found.short.n / measured
    p1, p50, p99 = (quantile(found.tokens, p) for p in (0.01, 0.5, 0.99))
    return graded(
        name,
        title,
        rate,
        CHECK.limit(config),
        examples=[e.model_copy() for e in found.short.examples],
        detail=f"{found.short.n:,} of {measured:,} samples learn from <= {limit:,} tokens; "
        f"p1 {count(p1)}, p50 {count(p50)}, p99 {count(p99)}; {_sources(found, missing)}",
    )


def _sources(found: LossFigures, missing: str) -> str:
    """Which path measured how many samples, and what was left unmeasured."""
    lacking = found.turns - found.from_ids
    text = f"from stored token ids: {found.from_ids}, from the chat template: {found.from_template}"
    if lacking:
        text += f"; {lacking} answers without token ids"
    unmeasured = found.turns - found.from_ids - found.from_template
    if unmeasured > 0:
        text += f", {unmeasured} not measured ({missing or 'not a stored layout'})"
    return text
