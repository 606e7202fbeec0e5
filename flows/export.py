"""Export an existing dataset to a trainer's format: stage 6 alone, for any dataset."""

from __future__ import annotations

from prefect import flow

from regen.config import ExportFormat, ExportOptions, Turns
from regen.run import OpenedDataset
from tasks.export import export


@flow(name="export", persist_result=False)
def export_dataset_flow(
    dataset: str,
    dest: str,
    format: ExportFormat = "specforge",
    turns: Turns = "each",
    exclude_truncated: bool = False,
    min_loss_tokens: int = 0,
    tokenizer_path: str | None = None,
    generated_only: bool | None = None,
    single_file: bool = False,
    token_freq: bool = False,
) -> dict[str, object]:
    """Write `dataset`'s committed ok rows to `dest` as `format`; the counts of its record.

    `tokenizer_path` (the model directory) lets token formats render turns without stored ids."""
    options = ExportOptions(
        format=format,
        turns=turns,
        exclude_truncated=exclude_truncated,
        min_loss_tokens=min_loss_tokens,
        generated_only=generated_only,
        single_file=single_file,
        token_freq=token_freq,
    )
    return export(OpenedDataset.open(dataset), dest, options, tokenizer_path).counts
