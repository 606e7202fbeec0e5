"""The quality audit: the last stage of a run and the gate that fails an unfit dataset.

The names below load on first use (PEP 562): `regen.config` embeds `AuditConfig`, and
importing the config must not load the audit's report, table and checks (polars, numpy,
matplotlib), most of what `import regen.config` used to cost.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from regen.audit.gate import Decision, LiveGate, gate_decision
    from regen.audit.report import write_report
    from regen.audit.result import AuditResult, Check, Example
    from regen.audit.run import run_audit
    from regen.audit.summary import AuditSettings, audit_rows, merge, settings_for
    from regen.audit.summary_model import Summary
    from regen.audit.table import audit_table
    from regen.audit.thresholds import AuditConfig, Threshold

_HOME = {
    "AuditConfig": "regen.audit.thresholds",
    "AuditResult": "regen.audit.result",
    "AuditSettings": "regen.audit.summary",
    "Check": "regen.audit.result",
    "Decision": "regen.audit.gate",
    "Example": "regen.audit.result",
    "LiveGate": "regen.audit.gate",
    "Summary": "regen.audit.summary_model",
    "Threshold": "regen.audit.thresholds",
    "audit_rows": "regen.audit.summary",
    "audit_table": "regen.audit.table",
    "gate_decision": "regen.audit.gate",
    "merge": "regen.audit.summary",
    "run_audit": "regen.audit.run",
    "settings_for": "regen.audit.summary",
    "write_report": "regen.audit.report",
}

__all__ = [
    "AuditConfig",
    "AuditResult",
    "AuditSettings",
    "Check",
    "Decision",
    "Example",
    "LiveGate",
    "Summary",
    "Threshold",
    "audit_rows",
    "audit_table",
    "gate_decision",
    "merge",
    "run_audit",
    "settings_for",
    "write_report",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)
