"""The quality audit: the last stage of a run and the gate that fails an unfit dataset."""

from regen.audit.report import write_report
from regen.audit.result import AuditResult, Check, Example
from regen.audit.run import run_audit
from regen.audit.table import audit_table
from regen.audit.thresholds import AuditConfig, Threshold

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
