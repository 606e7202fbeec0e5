"""Completeness: every planned id exactly once, read across the dataset's shards."""

from __future__ import annotations

import polars as pl

from regen.audit.dataset import DatasetView
from regen.audit.result import Check, Example
from regen.config import AuditConfig


def completeness_check(features: pl.DataFrame, view: DatasetView, config: AuditConfig) -> Check:
    """Missing, duplicate or unplanned ids, or an uncommitted planned shard, fail outright.

    `features` holds the id and shard of every committed row: a dataset-level check, the only
    one that reads more than one shard's summary (ids only, a few tens of MB at 1M rows)."""
    k = config.max_examples
    counts = features.group_by("id").agg(n=pl.len(), shard=pl.col("shard").first())
    dups = counts.filter(pl.col("n") > 1).sort("shard", "id")
    extra_rows = int((dups["n"] - 1).sum()) if dups.height else 0
    examples = [
        Example(id=i, reason=f"appears {n} times")
        for i, n in dups.head(k).select("id", "n").iter_rows()
    ]
    parts = [f"{extra_rows:,} duplicate rows"]
    if view.manifest_without_data:
        parts.append(f"manifest without data: shards {_list(view.manifest_without_data)}")
    if view.unusable_manifests:
        parts.append(f"unreadable or other-run manifests: shards {_list(view.unusable_manifests)}")
    broken = len(view.manifest_without_data) + len(view.unusable_manifests)
    if view.plan is None:
        bad = extra_rows + broken
        detail = "no plan.parquet, so missing ids cannot be counted; " + ", ".join(parts)
        return Check(
            name="completeness",
            title="completeness",
            status="fail" if bad else "warn",
            figure=extra_rows / max(features.height, 1),
            examples=examples,
            detail=detail,
        )
    plan = view.plan
    planned_shards = set(plan["shard"].unique().to_list())
    uncommitted = sorted(planned_shards - set(view.committed))
    missing = plan.join(counts, on="id", how="anti").sort("shard", "id")
    unplanned = counts.join(plan, on="id", how="anti").sort("shard", "id")
    for ident, shard in missing.head(k).select("id", "shard").iter_rows():
        why = "uncommitted shard" if shard in uncommitted else "missing from its shard"
        examples.append(Example(id=ident, reason=f"missing ({why} {shard})"))
    examples += [Example(id=i, reason="not in plan.parquet") for i in unplanned.head(k)["id"]]
    bad = extra_rows + missing.height + unplanned.height
    parts = [
        f"{missing.height:,} of {plan.height:,} planned ids missing",
        *parts,
        f"{unplanned.height:,} ids not in the plan",
        f"uncommitted shards: {_list(uncommitted) if uncommitted else 'none'}",
    ]
    failed = bad or uncommitted or broken
    return Check(
        name="completeness",
        title="completeness",
        status="fail" if failed else "pass",
        figure=bad / max(plan.height, 1),
        fail=0.0,
        examples=examples[: 3 * k],
        detail="; ".join(parts),
    )


def _list(shards: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(s) for s in shards[:limit])
    return shown + (f" … ({len(shards)} in all)" if len(shards) > limit else "")
