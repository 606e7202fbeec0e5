"""Audit an existing dataset: the gate alone, for a dataset made elsewhere or earlier."""

from __future__ import annotations

from prefect import flow
from prefect.states import Failed, State

from flows.labels import label_flow_run
from regen.audit.thresholds import AuditConfig
from regen.naming import dataset_name, dataset_slug
from tasks.audit import audit


@flow(name="audit", persist_result=False)
def audit_dataset(
    output: str, config: AuditConfig | None = None, tokenizer_path: str | None = None
) -> str | State[None]:
    """The verdict of the audit of `output` (a directory or s3:// prefix); Failed on a fail,
    with the verdict and the failing figures as the state's message."""
    label_flow_run(f"audit-{dataset_slug(output)}", ["audit", f"dataset:{dataset_name(output)}"])
    result = audit(output, config or AuditConfig(), tokenizer_path=tokenizer_path)
    if result.verdict == "fail":
        return Failed(message=result.failure_message())
    return result.verdict
