"""The quality audit: the last stage of a run and the gate that fails an unfit dataset."""

from regen.audit.gate import Decision, LiveGate, gate_decision
from regen.audit.report import write_report
from regen.audit.result import AuditResult, Check, Example
from regen.audit.run import run_audit
from regen.audit.summary import AuditSettings, Summary, audit_rows, merge, settings_for
from regen.audit.table import audit_table
from regen.audit.thresholds import AuditConfig, Threshold

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
