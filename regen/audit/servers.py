"""Check 9: per-server rates, so one bad server in a fleet stands out instead of averaging away."""

from __future__ import annotations

import math

import polars as pl

from regen.audit.result import Check, Example, ServerRates, grade
from regen.audit.thresholds import AuditConfig


def _flags(config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
    """Per-row defects over completions; `error` is the only one counted over every row."""
    flags = {
        "empty_answer": pl.col("empty_answer").is_not_null(),
        "empty_thinking": pl.col("empty_thinking"),
        "think_leak": pl.col("think_leak"),
        "truncation": pl.col("truncated"),
        "repetition": pl.col("repetition") >= config.repetition_share,
        "tiny_answer": pl.col("answer_tokens") <= config.tiny_length_tokens,
    }
    if not thinking:
        del flags["empty_thinking"]
    return flags


def server_rates(features: pl.DataFrame, config: AuditConfig, thinking: bool) -> pl.DataFrame:
    """One row per server: rows, completions, and the count of every defect."""
    ok = ~pl.col("is_error")
    return (
        features.group_by("server")
        .agg(
            rows=pl.len(),
            completions=ok.sum(),
            error=pl.col("is_error").sum(),
            **{k: (ok & v.fill_null(False)).sum() for k, v in _flags(config, thinking).items()},
        )
        .sort("server")
    )


def server_breakdown(counts: pl.DataFrame) -> list[ServerRates]:
    keys = [c for c in counts.columns if c not in {"server", "rows", "completions"}]
    out = []
    for row in counts.iter_rows(named=True):
        rates = {
            k: row[k] / max(row["rows"] if k == "error" else row["completions"], 1) for k in keys
        }
        out.append(ServerRates(server=row["server"], rows=row["rows"], rates=rates))
    return out


def _z_score(hits: int, n: int, rest_hits: int, rest_n: int) -> float:
    """How many standard errors one server's rate lies above the pooled rate of the others."""
    pooled = (hits + rest_hits) / (n + rest_n)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / rest_n))
    return math.inf if spread == 0 else (hits / n - rest_hits / rest_n) / spread


def server_check(
    features: pl.DataFrame, counts: pl.DataFrame, config: AuditConfig, thinking: bool
) -> Check:
    """The largest excess of one server's rate over the other servers', where it is an outlier.

    An outlier is `server_outlier_ratio` times worse than the rest pooled; the figure is the
    excess rate, so a fleet-wide problem (every server alike) is left to the other checks.
    """
    name, title = "server_outlier", "9 per-server breakdown"
    if counts.height < 2:
        return Check(
            name=name, title=title, status="skipped", figure=None, detail="one server: no peers"
        )
    flags = _flags(config, thinking)
    worst: tuple[float, str, str, float, float] | None = None
    findings = []
    for key in ["error", *flags]:
        denom = "rows" if key == "error" else "completions"
        total_hits, total_n = counts[key].sum(), counts[denom].sum()
        for server, hits, n in counts.select("server", key, denom).iter_rows():
            rest_n = total_n - n
            if n == 0 or rest_n == 0:
                continue
            rate, rest = hits / n, (total_hits - hits) / rest_n
            excess = rate - rest
            if excess <= 0 or rate < config.server_outlier_ratio * rest:
                continue
            if _z_score(hits, n, total_hits - hits, rest_n) < config.server_outlier_min_z:
                continue
            if excess >= config.server_outlier.warn:
                findings.append(f"{server} {key} {rate:.1%} vs {rest:.1%} on the others")
            if worst is None or excess > worst[0]:
                worst = (excess, server, key, rate, rest)
    if worst is None:
        return Check(
            name=name,
            title=title,
            status="pass",
            figure=0.0,
            warn=config.server_outlier.warn,
            fail=config.server_outlier.fail,
            detail=f"{counts.height} servers, none far worse than the others",
        )
    excess, server, key, _, _ = worst
    scope = pl.lit(True) if key == "error" else ~pl.col("is_error")
    flag = pl.col("is_error") if key == "error" else flags[key].fill_null(False)
    hits = features.filter((pl.col("server") == server) & scope & flag)
    return Check(
        name=name,
        title=title,
        status=grade(excess, config.server_outlier),
        figure=excess,
        warn=config.server_outlier.warn,
        fail=config.server_outlier.fail,
        examples=[
            Example(id=i, reason=f"{server}: {key}") for i in hits.head(config.max_examples)["id"]
        ],
        detail="; ".join(findings) or f"{server} {key} slightly above the others",
    )
