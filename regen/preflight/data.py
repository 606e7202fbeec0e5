"""The data's checks: the output storage writable and readable, the prompts' first rows usable."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from regen.config import RegenConfig
from regen.errors import UserError
from regen.preflight.report import CheckRow

if TYPE_CHECKING:
    from regen.storage import Storage


def check_storage(
    config: RegenConfig, open_output: Callable[[], Storage] | None = None
) -> CheckRow:
    """`open_output`: the run's own opening of its output, so the run opens it once."""
    from regen.storage import open_storage, probe

    storage = open_output() if open_output else open_storage(config.output)
    probe(storage)
    return CheckRow(name="storage", status="pass", figure=f"{storage.uri} writable and readable")


def check_prompts(config: RegenConfig, sample_rows: int = 1000) -> CheckRow:
    """A sample's figure (head, middle and tail of the file), with the valid rows per format:
    rows describe themselves, so a file may mix formats, and the count says whether that was
    meant. A sample rejected over `audit.rejects.fail` says the run would stop on it."""
    from regen.prompts import format_counts, preview

    try:
        found = preview(config.prompts, sample_rows)
    except UserError as err:
        return CheckRow(name="prompts", status="fail", figure=str(err), hint="fix the prompts file")
    counts = format_counts(found.formats)
    figure = f"{found.valid} of {found.rows_checked} rows valid ({counts}; {found.sampled})"
    if found.valid == 0:
        reason = f"{config.prompts}: {found.first_reason}"
        return CheckRow(name="prompts", status="fail", figure=reason, hint="fix the prompts file")
    if found.rejected:
        figure = f"{figure}; first: {found.first_reason}"
        share, limit = found.rejected / found.rows_checked, config.audit.rejects.fail
        hint = "rejected rows go to rejects/"
        if share >= limit:
            hint += f"; over audit.rejects.fail ({limit:.1%}) the run stops before generating"
        return CheckRow(name="prompts", status="warn", figure=figure, hint=hint)
    return CheckRow(name="prompts", status="pass", figure=figure)
