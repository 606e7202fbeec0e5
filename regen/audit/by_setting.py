"""The per-setting table (`Summary.by_setting`): rows, completions, defect counts and token
sums per sampling setting (and thinking mode), what the per_setting check judges. The defects
are the error rows and the flag checks the registry counts per setting."""

from __future__ import annotations

import polars as pl

from regen.audit.checks.per_setting import denominator
from regen.audit.registry import PER_SETTING
from regen.audit.result import SettingFigures
from regen.config import AuditConfig


def setting_flags(config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
    """Per-turn defects counted per setting (over completions); `error` is counted apart,
    over rows."""
    return {d.name: d.hit(config) for d in PER_SETTING.defects if d.counted(thinking)}


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
    """Per setting and defect, its first ids: the per_setting check's examples."""
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


def setting_breakdown(counts: dict[str, dict[str, int]]) -> list[SettingFigures]:
    """audit.json's per-setting figures: rates of every defect, mean tokens per answer."""
    out = []
    for setting, row in counts.items():
        rates = {
            k: n / row[denominator(k)]
            for k, n in row.items()
            if k in _DEFECTS and row.get(denominator(k), 0) > 0
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


_DEFECTS = frozenset(PER_SETTING.thresholds(AuditConfig()))
