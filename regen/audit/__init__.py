"""The quality audit: the last stage of a run and the gate that fails an unfit dataset.

Its settings are the config's `audit:` section (`regen.config.AuditConfig`).
"""

from regen.audit.final import run_audit
from regen.audit.registry import CHECKS
from regen.audit.report import write_report
from regen.audit.result import AuditResult, Check, Example
from regen.audit.rolling import Decision, RollingAudit, judge
from regen.audit.settings import AuditSettings, settings_for
from regen.audit.summary import audit_rows, merge
from regen.audit.summary_model import Summary

__all__ = [
    "CHECKS",
    "AuditResult",
    "AuditSettings",
    "Check",
    "Decision",
    "Example",
    "RollingAudit",
    "Summary",
    "audit_rows",
    "judge",
    "merge",
    "run_audit",
    "settings_for",
    "write_report",
]
