"""Room for a staging: refused before a byte is written, in figures the user can act on."""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from regen.display.figures import byte_size
from regen.errors import UserError
from regen.storage.filesystems import existing_parent, fs_type


def check_space(target: Path, need_bytes: int, margin_bytes: int, reclaimable: int = 0) -> None:
    """Refuse a copy that cannot fit, before a byte is written; a RAM disk must fit in RAM too."""
    anchor = existing_parent(target)
    free = shutil.disk_usage(anchor).free + reclaimable
    wanted = need_bytes + margin_bytes
    if wanted > free:
        raise UserError(
            f"{target}: staging needs {byte_size(need_bytes)} + {byte_size(margin_bytes)} margin, "
            f"only {byte_size(free)} free on {anchor}"
        )
    if fs_type(anchor) in {"tmpfs", "ramfs"}:
        available = psutil.virtual_memory().available + reclaimable
        if wanted > available:
            raise UserError(
                f"{target} is a RAM disk: staging needs {byte_size(need_bytes)} + "
                f"{byte_size(margin_bytes)} margin, only {byte_size(available)} of RAM available"
            )
