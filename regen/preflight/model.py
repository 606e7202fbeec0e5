"""The model's checks: a local directory SGLang can load, and room to stage it."""

from __future__ import annotations

import shutil
from pathlib import Path

from regen.config import RegenConfig
from regen.display.figures import byte_size
from regen.errors import UserError
from regen.preflight.report import CheckRow
from regen.storage.filesystems import existing_parent


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def model_bytes(config: RegenConfig) -> int | None:
    """The local model's size; None for a remote source, known only once it is listed."""
    source = Path(config.model.source)
    return _dir_size(source) if "://" not in config.model.source and source.is_dir() else None


def check_model(config: RegenConfig) -> CheckRow:
    """A local model directory SGLang cannot load fails here, not when seven servers start."""
    from regen.staging import missing_model_files

    source = config.model.source
    if config.engine.kind == "external":
        return CheckRow(name="model", status="skipped", figure="external servers load their own")
    if "://" in source:
        return CheckRow(name="model", status="skipped", figure=f"{source}: checked when staging")
    root = Path(source).expanduser()
    if not root.is_dir():
        return CheckRow(
            name="model",
            status="fail",
            figure=f"{source}: model directory does not exist",
            hint="fix model.source",
        )
    missing = missing_model_files(p.name for p in root.iterdir())
    if missing:
        return CheckRow(
            name="model",
            status="fail",
            figure=f"{source}: missing {', '.join(missing)}",
            hint="model.source must be a Hugging Face model directory",
        )
    return CheckRow(name="model", status="pass", figure=f"{source}: config, weights, tokenizer")


def check_stage_space(config: RegenConfig, model_bytes: int | None) -> CheckRow:
    if not config.model.stage:
        return CheckRow(name="stage dir", status="skipped", figure="model.stage is false")
    target = config.model.staged_path()
    if model_bytes is None:
        return CheckRow(
            name="stage dir",
            status="skipped",
            figure="model size known only after listing the source",
        )
    from regen.staging import check_space

    already = _dir_size(target) if target.is_dir() else 0
    free = shutil.disk_usage(existing_parent(target)).free
    figure = f"{byte_size(model_bytes)} model, {byte_size(free)} free at {target}"
    try:
        # The same rule staging applies, so a check that passes never fails at the copy.
        check_space(target, model_bytes - already, margin_bytes=0)
    except UserError as err:
        return CheckRow(
            name="stage dir",
            status="fail",
            figure=str(err),
            hint="free space on the RAM disk or set model.stage_dir",
        )
    return CheckRow(name="stage dir", status="pass", figure=figure)
