"""Length distributions: exact quantiles and histograms from value counts of integer lengths,
which stay exact over merged shards (the tiny-length check and the report read them)."""

from __future__ import annotations

import numpy as np

from regen.audit.result import Histogram, Quantiles
from regen.audit.summary_model import Summary


def length_columns(thinking: bool) -> list[str]:
    """The per-row length columns; the loss-mask check's loss_tokens are per sample and added
    apart."""
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


def length_quantiles(summary: Summary, columns: list[str]) -> dict[str, Quantiles]:
    """p1/p50/p99 of the row lengths over completions, and of the loss tokens per sample
    (measured apart from the other lengths, shown with them)."""
    lengths = quantiles(summary.lengths, columns) if summary.completions else {}
    if summary.loss.tokens:
        lengths |= quantiles({"loss_tokens": summary.loss.tokens}, ["loss_tokens"])
    return lengths
