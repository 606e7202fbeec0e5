"""Check 9: per-server rates, so one bad server in a fleet stands out instead of averaging away."""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from regen.audit.result import Check, Example, ServerRates, graded, skipped
from regen.audit.thresholds import AuditConfig


def server_flags(config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
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
            **{
                k: (ok & v.fill_null(False)).sum()
                for k, v in server_flags(config, thinking).items()
            },
        )
        .sort("server")
    )


def server_breakdown(counts: dict[str, dict[str, int]]) -> list[ServerRates]:
    out = []
    for server, row in counts.items():
        rates = {
            k: n / max(row["rows"] if k == "error" else row["completions"], 1)
            for k, n in row.items()
            if k not in {"rows", "completions"}
        }
        out.append(ServerRates(server=server, rows=row["rows"], rates=rates))
    return out


def _z_score(hits: int, n: int, rest_hits: int, rest_n: int) -> float:
    """How many standard errors one server's rate lies above the pooled rate of the others."""
    pooled = (hits + rest_hits) / (n + rest_n)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / rest_n))
    return math.inf if spread == 0 else (hits / n - rest_hits / rest_n) / spread


def server_check(
    counts: dict[str, dict[str, int]],
    examples: dict[str, dict[str, list[str]]],
    config: AuditConfig,
    thinking: bool,
) -> Check:
    """The largest excess of one server's rate over the other servers', where it is an outlier.

    An outlier is `server_outlier_ratio` times worse than the rest pooled; the figure is the
    excess rate, so a fleet-wide problem (every server alike) is left to the other checks.
    """
    name, title = "server_outlier", "9 per-server breakdown"
    if len(counts) < 2:
        return skipped(name, title, "one server: no peers")
    worst, findings = server_outliers(counts, config, thinking)
    if worst is None:
        return graded(
            name, title, 0.0, config.server_outlier,
            detail=f"{len(counts)} servers, none far worse than the others",
        )  # fmt: skip
    ids = examples.get(worst.server, {}).get(worst.defect, [])
    return graded(
        name,
        title,
        worst.excess,
        config.server_outlier,
        examples=[Example(id=i, reason=f"{worst.server}: {worst.defect}") for i in ids],
        detail="; ".join(findings) or f"{worst.server} {worst.defect} slightly above the others",
    )


@dataclass(frozen=True)
class Outlier:
    """One server's defect rate far above the rest of the fleet's."""

    server: str
    defect: str
    rate: float
    rest: float

    @property
    def excess(self) -> float:
        return self.rate - self.rest


def server_outliers(
    counts: dict[str, dict[str, int]], config: AuditConfig, thinking: bool
) -> tuple[Outlier | None, list[str]]:
    """The worst outlier (largest excess; the first found on a tie) and, for each (server,
    defect) whose excess reaches the warn threshold, a line naming it."""
    worst: Outlier | None = None
    findings = []
    servers = sorted(counts)
    for key in ["error", *server_flags(config, thinking)]:
        denom = "rows" if key == "error" else "completions"
        total_hits = sum(counts[s].get(key, 0) for s in servers)
        total_n = sum(counts[s][denom] for s in servers)
        for server in servers:
            hits, n = counts[server].get(key, 0), counts[server][denom]
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
            if worst is None or excess > worst.excess:
                worst = Outlier(server, key, rate, rest)
    return worst, findings
