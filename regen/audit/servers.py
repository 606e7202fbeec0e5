"""The per-server table: each server's rows and defect counts, so one bad server in a fleet
stands out instead of averaging away (the server_outlier check judges it). The defects are
those the registry's checks count per server (`AuditCheck.server_flags`)."""

from __future__ import annotations

import polars as pl

from regen.audit.registry import CHECKS
from regen.audit.result import ServerRates
from regen.config import AuditConfig


def server_flags(config: AuditConfig, thinking: bool) -> dict[str, pl.Expr]:
    """Per-row defects over completions, in check order; `error` is the only one counted over
    every row (`server_rates`)."""
    return {k: v for check in CHECKS for k, v in check.server_flags(config, thinking).items()}


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
