"""Stage 5 as a Prefect task: the gate. Its verdict is returned; the flow turns a fail into a
Failed state with a message, so an expected outcome reads as one, not as a crash's traceback."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from regen.audit import AuditResult, run_audit, write_report
from regen.audit.thresholds import AuditConfig
from regen.naming import artifact_key, dataset_name
from regen.storage import open_storage


@task(name="audit", persist_result=False)
def audit(output: str, config: AuditConfig, tokenizer_path: str | None = None) -> AuditResult:
    """Every check against its threshold; the markdown report becomes the dataset's artifact."""
    logger = get_run_logger()
    storage = open_storage(output)
    result = run_audit(storage, config, tokenizer_path=tokenizer_path)
    write_report(storage, result)
    create_markdown_artifact(
        key=artifact_key("audit-report", output),
        markdown=result.to_markdown() + f"\n\nReport files: `{storage.uri}/report/`\n",
        description=f"{dataset_name(output)}: audit {result.headline()}",
    )
    for check in result.ordered_checks():
        log = logger.error if check.status == "fail" else logger.info
        log("audit %-16s %-5s %s", check.name, check.status, check.detail)
    logger.info("audit %s", result.headline())
    return result
