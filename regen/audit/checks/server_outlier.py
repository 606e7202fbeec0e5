"""Server outlier: one server's defect rate far above the rest of the fleet's.

The per-server table (`regen.audit.servers`) counts every row defect per server; this check
names the server whose rate is furthest above the others', where chance does not explain it.
The live gate quarantines such a server rather than stopping the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.audit.checks.base import AuditCheck
from regen.audit.evidence import EVIDENCE, upper_tail
from regen.audit.result import Check, Example, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Summary
from regen.config import AuditConfig

_SIZES = {"rows", "completions"}


class ServerOutlier(AuditCheck):
    name = "server_outlier"
    title = "per-server breakdown"
    threshold = "server_outlier"
    # Answered by quarantine, not by a stop.
    live = False

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        return server_check(summary.servers, summary.server_examples, settings.config)

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        return None


CHECK = ServerOutlier()


def server_check(
    counts: dict[str, dict[str, int]],
    examples: dict[str, dict[str, list[str]]],
    config: AuditConfig,
) -> Check:
    """The largest excess of one server's rate over the other servers', where it is an outlier.

    An outlier is `server_outlier_ratio` times worse than the rest pooled, by more than chance
    explains at its row count (`server_outliers`); the figure is the excess rate, so a
    fleet-wide problem (every server alike) is left to the other checks.
    """
    name, title = CHECK.name, CHECK.title
    if len(counts) < 2:
        return skipped(name, title, "one server: no peers")
    worst, findings = server_outliers(counts, config)
    if worst is None:
        return graded(
            name, title, 0.0, CHECK.limit(config),
            detail=f"{len(counts)} servers, none worse than the others beyond chance",
        )  # fmt: skip
    ids = examples.get(worst.server, {}).get(worst.defect, [])
    return graded(
        name,
        title,
        worst.excess,
        CHECK.limit(config),
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
    counts: dict[str, dict[str, int]], config: AuditConfig
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
    # Every defect the per-server table counted (`regen.audit.servers`), in its order.
    keys = list(dict.fromkeys(k for s in servers for k in counts[s] if k not in _SIZES))
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
            if excess >= CHECK.limit(config).warn:
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
