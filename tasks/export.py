"""Stage 6 as a Prefect task: write one trainer format; the dataset's artifact has the counts."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from regen.export import ExportOptions
from regen.export.run import ExportSummary, export_dataset
from regen.naming import artifact_key, dataset_name
from regen.storage import open_storage


@task(name="export", task_run_name="export-{options.format}", persist_result=False)
def export(
    dataset: str, dest: str, options: ExportOptions, tokenizer_path: str | None = None
) -> ExportSummary:
    """Export `dataset` to `dest`; unchanged shards are not written again."""
    logger = get_run_logger()
    summary = export_dataset(
        open_storage(dataset), open_storage(dest), options, tokenizer_path=tokenizer_path
    )
    counts = summary.counts
    dropped = counts["dropped"]
    logger.info(
        "export %s to %s: %d samples from %d rows; %d shards written, %d unchanged; dropped %s",
        options.format,
        summary.dest,
        counts["samples"],
        counts["rows_exported"],
        len(summary.written),
        len(summary.reused),
        ", ".join(f"{k} {v}" for k, v in dropped.items()) or "none",
    )
    create_table_artifact(
        key=artifact_key(f"export-{options.format}", dataset),
        table=[
            {"figure": "destination", "value": summary.dest},
            {"figure": "rows (ok)", "value": counts["rows"]},
            {"figure": "error rows (never exported)", "value": counts["error_rows"]},
            {"figure": "rows exported", "value": counts["rows_exported"]},
            {"figure": "samples", "value": counts["samples"]},
            *({"figure": f"dropped: {k}", "value": v} for k, v in dropped.items()),
            {"figure": "shards written", "value": len(summary.written)},
            {"figure": "shards unchanged", "value": len(summary.reused)},
        ],
        description=f"{dataset_name(dataset)}: export {options.format}, "
        f"{counts['samples']} samples",
    )
    return summary
