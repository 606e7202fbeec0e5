"""Check 9: per-server rates, so one bad server in a fleet stands out instead of averaging away."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from regen.audit.evidence import EVIDENCE, upper_tail
from regen.audit.result import Check, Example, ServerRates, graded, skipped
from regen.config import AuditConfig


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


def server_check(
    counts: dict[str, dict[str, int]],
    examples: dict[str, dict[str, list[str]]],
    config: AuditConfig,
    thinking: bool,
) -> Check:
    """The largest excess of one server's rate over the other servers', where it is an outlier.

    An outlier is `server_outlier_ratio` times worse than the rest pooled, by more than chance
    explains at its row count (`server_outliers`); the figure is the excess rate, so a
    fleet-wide problem (every server alike) is left to the other checks.
    """
    name, title = "server_outlier", "9 per-server breakdown"
    if len(counts) < 2:
        return skipped(name, title, "one server: no peers")
    worst, findings = server_outliers(counts, config, thinking)
    if worst is None:
        return graded(
            name, title, 0.0, config.server_outlier,
            detail=f"{len(counts)} servers, none worse than the others beyond chance",
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
    defect) whose excess reaches the warn threshold, a line naming it.

    A server is an outlier in a defect when its rate is `server_outlier_ratio` times the other
    servers' pooled rate and so far above it that chance would rarely put that many of the
    fleet's hits on it (`unlikely_share`). Every (server, defect) pair is one such test, and
    `EVIDENCE` is spread over all of them (Bonferroni), so a healthy fleet of any size or row
    count shows an outlier less than once in 20: 4 truncations of 100 rows on one of 7
    servers against 3 of 600 on the others is chance; 20 of 100 against 3 of 600 is not.
    """
    worst: Outlier | None = None
    findings = []
    servers = sorted(counts)
    keys = ["error", *server_flags(config, thinking)]
    alpha = EVIDENCE / max(len(servers) * len(keys), 1)
    for key in keys:
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
            if not unlikely_share(hits, n, total_hits, total_n, alpha):
                continue
            if excess >= config.server_outlier.warn:
                findings.append(
                    f"{server} {key} {rate:.1%} vs {rest:.1%} on the others "
                    f"({hits:,} of {n:,} against {total_hits - hits:,} of {rest_n:,})"
                )
            if worst is None or excess > worst.excess:
                worst = Outlier(server, key, rate, rest)
    return worst, findings


def unlikely_share(hits: int, n: int, total_hits: int, total_n: int, alpha: float) -> bool:
    """Whether `hits` of a fleet's `total_hits` landing on a server that had `n` of its
    `total_n` rows is less likely than `alpha` by chance, were every server alike.

    Given the fleet's hits, a healthy server's share of them is a draw of `total_hits` at its
    share of the rows (the conditional two-proportion test, in its binomial form: a little
    conservative next to the exact hypergeometric one); the chance of as many or more is the
    binomial tail every gate reads (`regen.audit.evidence`). Needs 0 < n < total_n and a
    share above the server's row share (an excess over the other servers).
    """
    return upper_tail(hits, total_hits, n / total_n, enough=alpha) < alpha
