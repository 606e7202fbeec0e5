"""Rejected input rows: the share of input rows the plan rejected (bad JSON, wrong types,
empty, duplicate ids), by reason, with the first line numbers.

A rejected row is data the user meant to train on and will not get: half a file of broken
lines must fail the gate as loudly as half the answers empty. The figure is known when the
plan is made, before any GPU work, so the live gate judges it first (`regen.generation.live_gate`)
and the final audit again from `rejects/`.
"""

from __future__ import annotations

import polars as pl

from regen.audit.result import Check, Example, graded, skipped
from regen.config import AuditConfig

_LINES_SHOWN = 3


def rejects_check(rejects: pl.DataFrame | None, usable: int, config: AuditConfig) -> Check:
    """`rejects` (line, id, reason) of an input whose other `usable` rows were planned;
    skipped when the root recorded none (made before rejects were written)."""
    name, title = "rejects", "rejected input rows"
    if rejects is None:
        return skipped(
            name, title, "no rejects/rejects.parquet (a dataset made before rejects were recorded)"
        )
    total = rejects.height + usable
    rate = rejects.height / max(total, 1)
    threshold = config.rejects
    ordered = rejects.sort("line")
    reasons = (
        ordered.group_by("reason", maintain_order=True)
        .agg(n=pl.len(), lines=pl.col("line").head(_LINES_SHOWN))
        .sort("n", descending=True, maintain_order=True)
    )
    parts = [
        f"{reason}: {n:,} row{'s' if n > 1 else ''}, line{'s' if n > 1 else ''} {_lines(lines, n)}"
        for reason, n, lines in reasons.iter_rows()
    ]
    detail = f"{rejects.height:,} of {total:,} input rows rejected" + (
        ": " + "; ".join(parts) if parts else ""
    )
    examples = [
        Example(id=f"line {line}", reason=reason + (f" (id {ident})" if ident else ""))
        for line, ident, reason in ordered.head(config.max_examples)
        .select("line", "id", "reason")
        .iter_rows()
    ]
    return graded(name, title, rate, threshold, examples=examples, detail=detail)


def _lines(lines: list[int], n: int) -> str:
    shown = ", ".join(str(line) for line in lines)
    return shown + (", …" if n > len(lines) else "")
