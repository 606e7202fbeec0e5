"""The audit's row checks, in report order: the one list the summary, the final and live
gates, the report and the per-server and per-setting tables read.

A new check is a module of `regen/audit/checks/` whose `CHECK` is added here, a `Threshold`
field of `AuditConfig` it names and its name in `RowCheck` (`tests/test_audit_registry.py`
fails when the two lists differ). Completeness and rejects are the dataset's own checks, not
here: they read ids across shards and the input's rejects, not a summary.
"""

from __future__ import annotations

from regen.audit.checks import (
    aborted,
    answer_collapse,
    empty_answer,
    empty_thinking,
    error_rows,
    language_switch,
    loss_mask,
    repetition,
    server_outlier,
    template_parity,
    think_leak,
    tiny_length,
    tool_calls,
    truncated_in_thinking,
    truncation,
)
from regen.audit.checks.base import AuditCheck, FlagCheck
from regen.audit.checks.per_setting import PerSetting

FLAGS: tuple[FlagCheck, ...] = (
    empty_answer.CHECK,
    empty_thinking.CHECK,
    think_leak.CHECK,
    truncation.CHECK,
    truncated_in_thinking.CHECK,
    aborted.CHECK,
    repetition.CHECK,
    language_switch.CHECK,
)
"""The checks that flag single rows: measured by the scan, counted into `Summary.flags`."""

PER_SETTING = PerSetting(FLAGS)

CHECKS: tuple[AuditCheck, ...] = (
    error_rows.CHECK,
    *FLAGS,
    answer_collapse.CHECK,
    tiny_length.CHECK,
    server_outlier.CHECK,
    PER_SETTING,
    loss_mask.CHECK,
    template_parity.CHECK,
    tool_calls.CHECK,
)
