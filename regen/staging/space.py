"""Room for a staging: refused before a byte is written, in figures the user can act on."""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from regen.errors import UserError
from regen.storage.filesystems import existing_parent, fs_type


def check_space(target: Path, need_bytes: int, margin_bytes: int, reclaimable: int = 0) -> None:
    """Refuse a copy that cannot fit, before a byte is written; a RAM disk must fit in RAM too."""
    anchor = existing_parent(target)
    free = shutil.disk_usage(anchor).free + reclaimable
    wanted = need_bytes + margin_bytes
    if wanted > free:
        raise UserError(
            f"{target}: staging needs {_gb(need_bytes)} GB + {_gb(margin_bytes)} GB margin, "
            f"only {_gb(free)} GB free on {anchor}"
        )
    if fs_type(anchor) in {"tmpfs", "ramfs"}:
        available = psutil.virtual_memory().available + reclaimable
        if wanted > available:
            raise UserError(
                f"{target} is a RAM disk: staging needs {_gb(need_bytes)} GB + "
                f"{_gb(margin_bytes)} GB margin, only {_gb(available)} GB of RAM available"
            )


def _gb(nbytes: int) -> str:
    gb = nbytes / 1e9
    # Small figures keep two digits so a toy model does not read "needs 0.0 GB".
    return f"{gb:.1f}" if gb >= 0.1 else f"{gb:.2g}"
