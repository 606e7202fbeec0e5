"""Per-setting figures: the key figures per sampling setting, so one setting that collapses
is seen.

With `sampling.mix` or `regeneration.thinking_mix` the dataset is several datasets in one: a
setting drawn for 10 % of the rows whose answers are all empty moves the whole's rate by 10
points at most, under a fail threshold it would blow through on its own. Each setting is
judged as its own dataset, against the thresholds of the checks that measure the whole (the
error rows and every flag check counted per setting). The counts are the per-setting
table's (`regen.audit.by_setting`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from regen.audit.checks.base import AuditCheck, FlagCheck
from regen.audit.features import UNRECORDED
from regen.audit.result import Check, Example, grade, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Summary
from regen.config import AuditConfig, Threshold
from regen.display.figures import pct

_SEVERITY = {"pass": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class SettingDefect:
    """One setting's rate of one defect, graded against that defect's threshold."""

    setting: str
    defect: str
    hits: int
    n: int
    threshold: Threshold

    @property
    def rate(self) -> float:
        return self.hits / self.n

    @property
    def status(self) -> str:
        return grade(self.rate, self.threshold)

    def line(self) -> str:
        return f"{self.setting}: {self.defect} {pct(self.rate)} ({self.hits} of {self.n})"


def denominator(defect: str) -> str:
    """The per-setting count a defect's rate is a share of."""
    return {"error": "rows", "empty_thinking": "thinking"}.get(defect, "completions")


class PerSetting(AuditCheck):
    name = "per_setting"
    title = "per-setting figures"
    threshold = None

    def __init__(self, defects: Sequence[FlagCheck]) -> None:
        self.defects = tuple(d for d in defects if d.per_setting)
        """The flag checks counted per setting, besides error rows."""

    def thresholds(self, config: AuditConfig) -> dict[str, Threshold]:
        """Each defect's threshold: the one its own check grades the whole dataset with."""
        return {"error": config.error_rate, **{d.name: d.limit(config) for d in self.defects}}

    def graded_defects(
        self, counts: dict[str, dict[str, int]], config: AuditConfig
    ) -> list[SettingDefect]:
        """Every recorded setting's rate of every defect it was measured for."""
        limits = self.thresholds(config)
        out = []
        for setting, figures in sorted(counts.items()):
            if setting == UNRECORDED:
                continue
            for defect, threshold in limits.items():
                n = figures.get(denominator(defect), 0)
                if defect in figures and n > 0:
                    out.append(SettingDefect(setting, defect, figures[defect], n, threshold))
        return out

    def worst_defect(
        self, counts: dict[str, dict[str, int]], config: AuditConfig
    ) -> SettingDefect | None:
        """The worst graded (setting, defect): the highest status, then the rate nearest its
        fail threshold; the first found on a tie. None with fewer than two recorded settings."""
        if sum(s != UNRECORDED for s in counts) < 2:
            return None
        worst: SettingDefect | None = None
        best_key = (-1, -1.0)
        for found in self.graded_defects(counts, config):
            fail = found.threshold.fail
            key = (_SEVERITY[found.status], found.rate / fail if fail > 0 else found.rate)
            if key > best_key:
                worst, best_key = found, key
        return worst

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        """The worst setting's worst defect against that defect's threshold, every setting over
        a warn threshold named."""
        counts, config = summary.by_setting, settings.config
        worst = self.worst_defect(counts, config)
        if worst is None:
            return skipped(self.name, self.title, "one sampling setting: no mix to break down")
        over = [d.line() for d in self.graded_defects(counts, config) if d.status != "pass"]
        ids = summary.setting_examples.get(worst.setting, {}).get(worst.defect, [])
        recorded = sum(s != UNRECORDED for s in counts)
        return graded(
            self.name,
            self.title,
            worst.rate,
            worst.threshold,
            examples=[Example(id=i, reason=f"{worst.setting}: {worst.defect}") for i in ids],
            detail="; ".join(over) or f"{recorded} settings, each within the thresholds",
        )

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        """The rows of the setting whose figure it is."""
        worst = self.worst_defect(summary.by_setting, settings.config)
        return None if worst is None else worst.n
