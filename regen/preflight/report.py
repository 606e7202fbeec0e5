"""The provisioning table: one row per check, the report that gates a run, and its printing."""

from __future__ import annotations

import shutil

from pydantic import BaseModel

from regen.display.words import STYLE, Status

_LOUD: dict[Status, int] = {"fail": 0, "warn": 1}


class CheckRow(BaseModel):
    """One line of the provisioning table: what was checked, what was found, how to fix it."""

    name: str
    status: Status
    figure: str = ""
    hint: str = ""


class PreflightReport(BaseModel):
    rows: list[CheckRow]

    @property
    def ok(self) -> bool:
        return all(r.status != "fail" for r in self.rows)

    def table(self) -> list[dict[str, str]]:
        """The rows as a table's cells: failures, then warnings, then the rest (each in check
        order), their status in capitals, as they are what the reader came for."""
        return [
            {**r.model_dump(), "status": r.status.upper() if r.status in _LOUD else r.status}
            for r in sorted(self.rows, key=lambda r: _LOUD.get(r.status, len(_LOUD)))
        ]

    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status == "fail"]

    def summary(self) -> str:
        """Every failed check on one line, for the error that fails the stage."""
        return "; ".join(self.failure_lines())

    def failure_lines(self) -> list[str]:
        """One line per failed check: its name, figure and fix."""
        return [
            f"{r.name}: {r.figure} ({r.hint})" if r.hint else f"{r.name}: {r.figure}"
            for r in self.failures()
        ]


def print_report(
    report: PreflightReport, title: str = "regen provisioning checks", verdict: str = "provisioning"
) -> None:
    """The table, then `<verdict>: ok` (naming the rows that warn) or `<verdict>: FAILED`."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for col in ("check", "status", "figure", "fix"):
        table.add_column(col)
    for r in report.rows:
        # Figures quote paths and pins ("x[y]==1") that rich would read as markup.
        table.add_row(r.name, f"[{STYLE[r.status]}]{r.status}[/]", escape(r.figure), escape(r.hint))
    Console(width=max(120, shutil.get_terminal_size().columns)).print(table)
    # A warning can foretell a stop (prompts over audit.rejects.fail): "ok" alone hid it.
    warned = [r.name for r in report.rows if r.status == "warn"]
    said = f"ok, with warnings: {', '.join(warned)} (read their fix)" if warned else "ok"
    print(f"{verdict}: " + (said if report.ok else "FAILED"))
