"""Check 9b: the key figures per sampling setting, so one setting that collapses is seen.

With `sampling.mix` or `regeneration.thinking_mix` the dataset is several datasets in one: a
setting drawn for 10 % of the rows whose answers are all empty moves the whole's rate by 10
points at most, under a fail threshold it would blow through on its own. Each setting is
judged as its own dataset, against the thresholds of the checks that measure the whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from regen.audit.features import UNRECORDED
from regen.audit.result import Check, Example, SettingFigures, grade, graded, skipped
from regen.config import AuditConfig, Threshold
from regen.figures import pct

NAME, TITLE = "per_setting", "9b per-setting figures"
_SEVERITY = {"pass": 0, "warn": 1, "fail": 2}


def setting_flags(config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
    """Per-turn defects counted per setting (over completions); `error` is counted apart,
    over rows."""
    flags = {
        "empty_answer": pl.col("empty_answer").is_not_null(),
        "empty_thinking": pl.col("empty_thinking"),
        "think_leak": pl.col("think_leak"),
        "truncation": pl.col("truncated"),
        "truncated_in_thinking": pl.col("truncated_in_thinking"),
        "repetition": pl.col("repetition") >= config.repetition_share,
    }
    if not thinking:
        del flags["empty_thinking"]
    return flags


def thresholds(config: AuditConfig) -> dict[str, Threshold]:
    """Each defect's threshold: the one its own check grades the whole dataset with."""
    return {
        "error": config.error_rate,
        "empty_answer": config.empty_answer,
        "empty_thinking": config.empty_thinking,
        "think_leak": config.think_leak,
        "truncation": config.truncated,
        "truncated_in_thinking": config.truncated_in_thinking,
        "repetition": config.repetition,
    }


def setting_counts(
    features: pl.DataFrame, ok: pl.DataFrame, config: AuditConfig, thinking: bool
) -> dict[str, dict[str, int]]:
    """Setting -> rows and errors (over conversations), completions, thinking completions,
    each defect and the token sums (over answered turns)."""
    rows = features.group_by("setting").agg(rows=pl.len(), error=pl.col("is_error").sum())
    turns = ok.group_by("setting").agg(
        completions=pl.len(),
        thinking=pl.col("thinks").sum(),
        completion_tokens=pl.col("completion_tokens").fill_null(0).sum(),
        reasoning_tokens=pl.col("reasoning_tokens").fill_null(0).sum(),
        **{k: v.fill_null(False).sum() for k, v in setting_flags(config, thinking).items()},
    )
    joined = rows.join(turns, on="setting", how="full", coalesce=True).fill_null(0).sort("setting")
    return {
        row.pop("setting"): {k: int(v) for k, v in row.items()}
        for row in joined.iter_rows(named=True)
    }


def setting_examples(
    features: pl.DataFrame, ok: pl.DataFrame, config: AuditConfig, thinking: bool, k: int
) -> dict[str, dict[str, list[str]]]:
    """Per setting and defect, its first ids: the examples of check 9b."""
    out: dict[str, dict[str, list[str]]] = {}
    named = [(features, "error", pl.col("is_error"))] + [
        (ok, name, flag.fill_null(False)) for name, flag in setting_flags(config, thinking).items()
    ]
    for frame, name, flag in named:
        found = (
            frame.filter(flag).group_by("setting", maintain_order=True).agg(pl.col("id").head(k))
        )
        for setting, ids in found.iter_rows():
            out.setdefault(setting, {})[name] = ids
    return out


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


def _denominator(defect: str) -> str:
    return {"error": "rows", "empty_thinking": "thinking"}.get(defect, "completions")


def graded_defects(counts: dict[str, dict[str, int]], config: AuditConfig) -> list[SettingDefect]:
    """Every recorded setting's rate of every defect it was measured for."""
    limits = thresholds(config)
    out = []
    for setting, figures in sorted(counts.items()):
        if setting == UNRECORDED:
            continue
        for defect, threshold in limits.items():
            n = figures.get(_denominator(defect), 0)
            if defect in figures and n > 0:
                out.append(SettingDefect(setting, defect, figures[defect], n, threshold))
    return out


def worst_defect(counts: dict[str, dict[str, int]], config: AuditConfig) -> SettingDefect | None:
    """The worst graded (setting, defect): the highest status, then the rate nearest its fail
    threshold; the first found on a tie. None with fewer than two recorded settings."""
    if sum(s != UNRECORDED for s in counts) < 2:
        return None
    worst: SettingDefect | None = None
    best_key = (-1, -1.0)
    for found in graded_defects(counts, config):
        fail = found.threshold.fail
        key = (_SEVERITY[found.status], found.rate / fail if fail > 0 else found.rate)
        if key > best_key:
            worst, best_key = found, key
    return worst


def setting_check(
    counts: dict[str, dict[str, int]],
    examples: dict[str, dict[str, list[str]]],
    config: AuditConfig,
) -> Check:
    """The worst setting's worst defect against that defect's threshold, every setting over a
    warn threshold named."""
    worst = worst_defect(counts, config)
    if worst is None:
        return skipped(NAME, TITLE, "one sampling setting: no mix to break down")
    over = [d.line() for d in graded_defects(counts, config) if d.status != "pass"]
    ids = examples.get(worst.setting, {}).get(worst.defect, [])
    settings = sum(s != UNRECORDED for s in counts)
    return graded(
        NAME,
        TITLE,
        worst.rate,
        worst.threshold,
        examples=[Example(id=i, reason=f"{worst.setting}: {worst.defect}") for i in ids],
        detail="; ".join(over) or f"{settings} settings, each within the thresholds",
    )


def setting_breakdown(counts: dict[str, dict[str, int]]) -> list[SettingFigures]:
    """audit.json's per-setting figures: rates of every defect, mean tokens per answer."""
    out = []
    for setting, row in counts.items():
        rates = {
            k: n / row[_denominator(k)]
            for k, n in row.items()
            if k in _DEFECTS and row.get(_denominator(k), 0) > 0
        }
        tokens = {
            name: row.get(name, 0) / row[of]
            for name, of in (("completion_tokens", "completions"), ("reasoning_tokens", "thinking"))
            if row.get(of, 0) > 0
        }
        out.append(
            SettingFigures(
                setting=setting,
                rows=row.get("rows", 0),
                completions=row.get("completions", 0),
                rates=rates,
                mean_tokens=tokens,
            )
        )
    return out


_DEFECTS = frozenset(thresholds(AuditConfig()))
