"""The words every check speaks: one vocabulary for the provisioning table and the audit.

audit.json publishes these words, so they are the audit's; a reader of either table, the
Prefect artifacts or the JSON learns one set.
"""

from __future__ import annotations

from typing import Literal

Status = Literal["pass", "warn", "fail", "skipped"]

# How a terminal table colours each word (rich markup styles).
STYLE: dict[Status, str] = {
    "pass": "green",
    "warn": "yellow",
    "fail": "bold red",
    "skipped": "dim",
}
