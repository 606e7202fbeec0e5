"""Stage 5 as a Prefect task: the audit's verdict and its artifacts.

A failed audit ends the task Failed with the verdict as its message (`failure_message`),
returned rather than raised: the flow ends with the same message (`flows.failures`), so an
expected outcome reads as one, not as a crash's traceback, and a stopped run's audit box is
not green.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE
from prefect.states import Failed, State

from regen.audit import AuditResult, run_audit, write_report
from regen.audit.report import plot_pngs
from regen.canary import stopped_run
from regen.config import AuditConfig
from regen.display.naming import artifact, dataset_markdown
from regen.run import OpenedDataset
from tasks.cards import publish_markdown
from tasks.pictures import embedded


@task(name="audit", persist_result=False, cache_policy=NONE)
def audit(
    dataset: OpenedDataset, config: AuditConfig, tokenizer_path: str | None = None
) -> AuditResult | State[None]:
    """Every check against its threshold; the markdown report becomes the dataset's artifact.
    A run the live gate stopped is judged on the rows it generated, its canary's included,
    and fails naming the gate."""
    logger, output, storage = get_run_logger(), dataset.output, dataset.storage
    result = run_audit(storage, config, tokenizer_path=tokenizer_path, stopped=stopped_run(storage))
    plots = plot_pngs(result)
    write_report(storage, result, plots)
    # The plots carried in the artifact: report/*.png are out of the UI's reach.
    create_markdown_artifact(
        markdown=result.to_markdown()
        + f"\nReport files: `{storage.uri}/report/`\n\n"
        + embedded(plots),
        **artifact("audit-report", output, f"audit {result.headline()}"),
    )
    # The plan's "N to generate" is history now: the dataset as the run leaves it, on the
    # plan's card (one dataset card per run).
    committed = result.rows - result.uncommitted
    planned = f" of {result.planned:,} planned" if result.planned is not None else ""
    publish_markdown(
        "dataset",
        output,
        dataset_markdown(
            storage.uri, f"{committed:,} rows committed{planned}; audit {result.headline()}",
            stopped=result.stopped is not None,
        ),
        result.dataset_card(),
    )  # fmt: skip
    for check in result.ordered_checks():
        log = logger.error if check.status == "fail" else logger.info
        log("audit %-16s %-5s %s", check.name, check.status, check.detail)
    logger.info("audit %s", result.headline())
    if result.verdict == "fail":
        return Failed(message=result.failure_message())
    return result
