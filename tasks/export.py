"""Stage 6 as a Prefect task: the trainer formats, one task per format; their artifacts."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NONE

from regen.config import ExportOptions
from regen.display.naming import artifact
from regen.export.exporter import ExportSummary, export_dataset
from regen.run import OpenedDataset
from regen.storage import open_storage


@task(
    name="export", task_run_name="export-{options.format}", persist_result=False, cache_policy=NONE
)
def export(
    dataset: OpenedDataset, dest: str, options: ExportOptions, tokenizer_path: str | None = None
) -> ExportSummary:
    """Export `dataset` to `dest`; unchanged shards are not written again."""
    summary = export_dataset(
        dataset.storage, open_storage(dest), options, tokenizer_path=tokenizer_path
    )
    logger = get_run_logger()
    logger.info(summary.headline(options.format))
    for line in summary.notes():
        (logger.warning if line.startswith("warning") else logger.info)("export %s", line)
    what = f"{summary.counts['samples']:,} samples · export {options.format}"
    create_table_artifact(
        summary.table(), **artifact(f"export-{options.format}", dataset.output, what)
    )
    return summary
