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


def check_prompt_source(config: RegenConfig, hf_token: str | None = None) -> CheckRow:
    """A Hub prompt set: its revision resolved to a commit and the files its split selects,
    with their sizes; nothing is downloaded (the prompts row then reads the first file)."""
    from regen.prompts.hub import resolve

    try:
        found = resolve(
            config.prompts, split=config.input.split, subset=config.input.subset, token=hf_token
        )
    except UserError as err:
        return CheckRow(
            name="prompt source", status="fail", figure=str(err), hint="fix prompts or input.*"
        )
    shown = ", ".join(f"{f.path} ({_mb(f.size)})" for f in found.files[:3])
    more = f" and {len(found.files) - 3} more" if len(found.files) > 3 else ""
    figure = (
        f"{found.uri.repo} at commit {found.commit}: {found.chosen_by}, {len(found.files)} "
        f"files, {_mb(found.total_bytes)}: {shown}{more}"
    )
    return CheckRow(name="prompt source", status="pass", figure=figure)


def _mb(size: int | None) -> str:
    return "size unknown" if size is None else f"{size / 1e6:.1f} MB"


def check_prompts(
    config: RegenConfig, sample_rows: int = 1000, hf_token: str | None = None
) -> CheckRow:
    """The first rows' figure, with the valid rows per format: rows describe themselves, so a
    file may mix formats, and the count says whether that was meant."""
    from regen.prompts import format_counts, preview, read_options

    try:
        found = preview(config.prompts, sample_rows, options=read_options(config.input, hf_token))
    except UserError as err:
        return CheckRow(name="prompts", status="fail", figure=str(err), hint="fix the prompts file")
    counts = format_counts(found.formats)
    figure = f"{found.valid} of first {found.rows_checked} rows valid ({counts})"
    if found.valid == 0:
        reason = f"{config.prompts}: {found.first_reason}"
        return CheckRow(name="prompts", status="fail", figure=reason, hint="fix the prompts file")
    if found.rejected:
        figure = f"{figure}; first: {found.first_reason}"
        return CheckRow(
            name="prompts", status="warn", figure=figure, hint="rejected rows go to rejects/"
        )
    return CheckRow(name="prompts", status="pass", figure=figure)
