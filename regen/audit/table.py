"""The audit as a terminal table, for `regen audit DATASET`."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from regen.audit.result import AuditResult
from regen.display.figures import pct
from regen.display.words import STYLE


def audit_table(result: AuditResult) -> Table:
    """One row per check, failures and warnings first: status, figure against its thresholds,
    and what it found."""
    table = Table(title=f"audit {result.dataset}: {result.headline()}", title_justify="left")
    for column in ("check", "status", "figure", "warn", "fail", "detail", "examples"):
        table.add_column(column, overflow="fold")
    for c in result.ordered_checks():
        table.add_row(
            c.title,
            f"[{STYLE[c.status]}]{c.status}[/]",
            pct(c.figure),
            pct(c.warn),
            pct(c.fail),
            Text(c.detail),
            Text(", ".join(e.id for e in c.examples[:3])),
        )
    return table
