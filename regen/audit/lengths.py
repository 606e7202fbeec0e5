"""Check 8: length distributions, and a sudden mode at a tiny length.

A healthy generation has smooth length distributions; a template or parser bug shows as
a large share of rows at nearly the same tiny length (the incident: 6 tokens). Lengths are
kept as value counts of integers, so quantiles stay exact over merged shards.
"""

from __future__ import annotations

import numpy as np

from regen.audit.result import Check, Histogram, Quantiles, graded, skipped
from regen.audit.summary_model import Summary
from regen.config import AuditConfig
from regen.figures import count


def length_columns(thinking: bool) -> list[str]:
    """The per-row length columns; check 10's loss_tokens are per sample and added apart."""
    cols = ["prompt_tokens", "reasoning_tokens", "completion_tokens", "answer_tokens"]
    if not thinking:
        cols.remove("reasoning_tokens")
    return cols


def quantile(counts: dict[int, int], q: float) -> float | None:
    """polars' default ('nearest') quantile of the values these counts describe."""
    total = sum(counts.values())
    if total == 0:
        return None
    # polars rounds half away from zero: for a non-negative index, floor(x + 0.5).
    index = int(np.floor((total - 1) * q + 0.5))
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen > index:
            return float(value)
    raise AssertionError("unreachable: index < total")


def quantiles(lengths: dict[str, dict[int, int]], columns: list[str]) -> dict[str, Quantiles]:
    return {
        c: Quantiles(
            p1=quantile(lengths.get(c, {}), 0.01),
            p50=quantile(lengths.get(c, {}), 0.5),
            p99=quantile(lengths.get(c, {}), 0.99),
        )
        for c in columns
    }


def histograms(lengths: dict[str, dict[int, int]], columns: list[str]) -> dict[str, Histogram]:
    """Power-of-two bins: tiny lengths get their own bins, long tails stay readable."""
    out = {}
    for c in columns:
        counts = lengths.get(c, {})
        if not counts:
            continue
        values = np.fromiter(counts, dtype=np.int64)
        weights = np.fromiter(counts.values(), dtype=np.int64)
        top = max(int(values.max()), 1)
        edges = np.concatenate([[0], 2.0 ** np.arange(0, int(np.ceil(np.log2(top + 1))) + 1)])
        binned, _ = np.histogram(values, bins=edges, weights=weights)
        out[c] = Histogram(edges=edges.tolist(), counts=binned.astype(np.int64).tolist())
    return out


def tiny_length_check(
    summary: Summary, config: AuditConfig, columns: list[str], lengths: dict[str, Quantiles]
) -> Check:
    """The worst share of completions at or under `tiny_length_tokens`, over length columns."""
    name, title = "tiny_length", "8 tiny-length mode"
    if summary.completions == 0:
        return skipped(name, title, "no completions")
    tiny = config.tiny_length_tokens
    shares = {
        c: (summary.tiny[c].n if c in summary.tiny else 0)
        / max(sum(summary.lengths.get(c, {}).values()), 1)
        for c in columns
        if c != "loss_tokens"
    }
    worst = max(shares, key=lambda c: shares[c])
    rate = float(shares[worst])
    p50 = ", ".join(f"{c} {_g(q.p50)}" for c, q in lengths.items())
    over = [f"{c} {v:.1%}" for c, v in shares.items() if v > 0]
    return graded(
        name,
        title,
        rate,
        config.tiny_length,
        examples=[e.model_copy() for e in summary.tiny[worst].examples] if rate else [],
        detail=f"share at <= {tiny} tokens: {', '.join(over) or 'none'}; p50: {p50}",
    )


def _g(value: float | None) -> str:
    return count(value)
