"""How unlikely a count is by chance: the one test every judgement of a sample uses.

The live gate asks whether a sample's bad rows show a run at or over a fail threshold
(`regen.audit.rolling.shown_over`); the server_outlier check asks whether one server's bad rows
stand out from the other servers' by more than chance (`regen.audit.checks.server_outlier`).
Both are an exact binomial tail read against `EVIDENCE`, so "a finding" means the same thing
at the canary, in the rolling audit and in the final report.
"""

from __future__ import annotations

import math

EVIDENCE = 0.05
"""A finding is what chance alone would show less than once in 20. The live gate judges a
sample of the run, so a check over its fail threshold stops it only when its bad rows would
come less than once in 20 (one-sided, exact binomial) from a run whose true rate is just at the
threshold: 1 most common answer of 4 rows never stops a canary, 223 empty answers of 256 do at
once, and at thousands of rows the bound is the figure itself. The server_outlier check spends
the same 5 % on the whole fleet: a healthy fleet (every server alike) shows an outlier less
than once in 20."""


def upper_tail(k: int, n: int, p: float, enough: float = EVIDENCE) -> float:
    """P(X >= k) for X ~ Binomial(n, p), k above the mean (0 < p < 1, 0 < k <= n).

    The terms only fall from k on, so summing them until they stop adding costs some sqrt(n)
    terms, not n (a million rows). The sum stops once it reaches `enough`: a figure at or over
    `enough` means "not unlikely", not the exact tail.
    """
    log_term = (
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        + k * math.log(p) + (n - k) * math.log1p(-p)
    )  # fmt: skip
    term, total, odds = math.exp(log_term), 0.0, p / (1 - p)
    for i in range(k, n + 1):
        total += term
        if term < total * 1e-12 or total >= enough:
            break
        term *= (n - i) / (i + 1) * odds
    return total
