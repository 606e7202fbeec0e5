"""Audit an existing dataset: the gate alone, for a dataset made elsewhere or earlier."""

from __future__ import annotations

from prefect import flow

from regen.audit.thresholds import AuditConfig
from tasks.audit import audit


@flow(name="audit", persist_result=False)
def audit_dataset(
    output: str, config: AuditConfig | None = None, tokenizer_path: str | None = None
) -> str:
    """The verdict of the audit of `output` (a directory or s3:// prefix); Failed on a fail."""
    result = audit(output, config or AuditConfig(), tokenizer_path=tokenizer_path)
    return result.verdict
