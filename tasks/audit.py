"""Stage 5 as a Prefect task: the gate. A failed audit fails the run after the report is written."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from regen.audit import AuditResult, run_audit, write_report
from regen.audit.thresholds import AuditConfig
from regen.errors import UserError
from regen.storage import open_storage


class AuditFailed(UserError):
    """The dataset is unfit for training; the data and the report stay where they are."""


@task(name="audit", persist_result=False)
def audit(output: str, config: AuditConfig, tokenizer_path: str | None = None) -> AuditResult:
    """Every check against its threshold; the markdown report becomes a keyed artifact."""
    logger = get_run_logger()
    storage = open_storage(output)
    result = run_audit(storage, config, tokenizer_path=tokenizer_path)
    write_report(storage, result)
    create_markdown_artifact(
        key="audit-report",
        markdown=result.to_markdown() + f"\n\nReport files: `{storage.uri}/report/`\n",
        description=f"regen audit: {result.verdict}",
    )
    for check in result.checks:
        log = logger.error if check.status == "fail" else logger.info
        log("audit %-16s %-5s %s", check.name, check.status, check.detail)
    if result.verdict == "fail":
        failed = ", ".join(c.name for c in result.checks if c.status == "fail")
        raise AuditFailed(f"audit failed ({failed}); data and report kept at {storage.uri}")
    return result
