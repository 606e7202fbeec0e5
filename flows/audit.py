"""Audit an existing dataset: the gate alone, for a dataset made elsewhere or earlier."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from flows.failures import failed_with, quiet_failures
from flows.labels import label_flow_run
from regen.audit import AuditResult
from regen.config import AuditConfig
from regen.display.naming import dataset_name, dataset_slug
from regen.run import OpenedDataset
from tasks.audit import audit


@flow(name="audit", persist_result=False)
def audit_dataset(
    output: str, config: AuditConfig | None = None, tokenizer_path: str | None = None
) -> str | State[None]:
    """The verdict of the audit of `output` (a directory or s3:// prefix); Failed on a fail,
    with the verdict and the failing figures as the state's message."""
    quiet_failures()
    label_flow_run(f"audit-{dataset_slug(output)}", ["audit", f"dataset:{dataset_name(output)}"])
    dataset = OpenedDataset.open(output)
    judged = audit(
        dataset, config or AuditConfig(), tokenizer_path=tokenizer_path, return_state=True
    )
    if ended := failed_with(judged):
        return ended
    result = judged.result()
    assert isinstance(result, AuditResult), "a passed or warned audit returns its result"
    return result.verdict
