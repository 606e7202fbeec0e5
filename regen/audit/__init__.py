"""The quality audit: the last stage of a run and the gate that fails an unfit dataset.

The names below load on first use (PEP 562): `regen.config` embeds `AuditConfig`, and
importing the config must not load the audit's report, table and checks (polars, numpy,
matplotlib), most of what `import regen.config` used to cost.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from regen.audit.report import write_report
    from regen.audit.result import AuditResult, Check, Example
    from regen.audit.run import run_audit
    from regen.audit.table import audit_table
    from regen.audit.thresholds import AuditConfig, Threshold

_HOME = {
    "AuditConfig": "regen.audit.thresholds",
    "AuditResult": "regen.audit.result",
    "Check": "regen.audit.result",
    "Example": "regen.audit.result",
    "Threshold": "regen.audit.thresholds",
    "audit_table": "regen.audit.table",
    "run_audit": "regen.audit.run",
    "write_report": "regen.audit.report",
}

__all__ = [
    "AuditConfig",
    "AuditResult",
    "Check",
    "Example",
    "Threshold",
    "audit_table",
    "run_audit",
    "write_report",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)
