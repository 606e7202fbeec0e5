"""Check 8: length distributions, and a sudden mode at a tiny length.

A healthy generation has smooth length distributions; a template or parser bug shows as
a large share of rows at nearly the same tiny length (the incident: 6 tokens).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from regen.audit.result import Check, Example, Histogram, Quantiles, grade
from regen.audit.thresholds import AuditConfig


def length_columns(thinking: bool) -> list[str]:
    """The per-row length columns; check 10's loss_tokens are per sample and added apart."""
    cols = ["prompt_tokens", "reasoning_tokens", "completion_tokens", "answer_tokens"]
    if not thinking:
        cols.remove("reasoning_tokens")
    return cols


def quantiles(ok: pl.DataFrame, columns: list[str]) -> dict[str, Quantiles]:
    if ok.height == 0:
        return {}
    exprs = [
        pl.col(c).cast(pl.Float64).quantile(q).alias(f"{c}:{q}")
        for c in columns
        for q in (0.01, 0.5, 0.99)
    ]
    row = ok.select(exprs).row(0, named=True)
    return {
        c: Quantiles(p1=row[f"{c}:0.01"], p50=row[f"{c}:0.5"], p99=row[f"{c}:0.99"])
        for c in columns
    }


def histograms(ok: pl.DataFrame, columns: list[str]) -> dict[str, Histogram]:
    """Power-of-two bins: tiny lengths get their own bins, long tails stay readable."""
    out = {}
    for c in columns:
        values = ok[c].drop_nulls().to_numpy()
        if values.size == 0:
            continue
        top = max(int(values.max()), 1)
        edges = np.concatenate([[0], 2.0 ** np.arange(0, int(np.ceil(np.log2(top + 1))) + 1)])
        counts, _ = np.histogram(values, bins=edges)
        out[c] = Histogram(edges=edges.tolist(), counts=counts.tolist())
    return out


def tiny_length_check(
    ok: pl.DataFrame, config: AuditConfig, columns: list[str], lengths: dict[str, Quantiles]
) -> Check:
    """The worst share of completions at or under `tiny_length_tokens`, over length columns."""
    name, title = "tiny_length", "8 tiny-length mode"
    if ok.height == 0:
        return Check(name=name, title=title, status="skipped", figure=None, detail="no completions")
    tiny = config.tiny_length_tokens
    shares = ok.select(
        (pl.col(c) <= tiny).sum().truediv(pl.col(c).count().clip(lower_bound=1)).alias(c)
        for c in columns
        if c != "loss_tokens"
    ).row(0, named=True)
    worst = max(shares, key=lambda c: shares[c])
    rate = float(shares[worst])
    hits = ok.filter(pl.col(worst) <= tiny).head(config.max_examples).select("id", worst)
    p50 = ", ".join(f"{c} {_g(q.p50)}" for c, q in lengths.items())
    over = [f"{c} {v:.1%}" for c, v in shares.items() if v > 0]
    return Check(
        name=name,
        title=title,
        status=grade(rate, config.tiny_length),
        figure=rate,
        warn=config.tiny_length.warn,
        fail=config.tiny_length.fail,
        examples=[Example(id=i, reason=f"{worst} = {v}") for i, v in hits.iter_rows()]
        if rate
        else [],
        detail=f"share at <= {tiny} tokens: {', '.join(over) or 'none'}; p50: {p50}",
    )


def _g(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"
