"""A full disk under the output is fatal at once, never a passing fault.

Retried, a full disk regenerated the shard (minutes of GPUs) only to fail its write again, and
the final line then listed shards that had committed as failed. Here ENOSPC/EDQUOT become one
line naming the device, what it holds and about how much the run still needs; no retry, no
new shard; the committed shards stay committed and a rerun after the disk grew resumes.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import psutil

from regen.display.figures import byte_size
from regen.errors import UserError

_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFull(UserError):
    """The output's disk (or quota) is full: the run stops; what it committed stays."""


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in _FULL


def _device(path: Path) -> str:
    """`/dev/nvme0n1p2 at /data`: the file system `path` is on, by its longest mount point."""
    best = None
    for part in psutil.disk_partitions(all=True):
        mount = Path(part.mountpoint)
        if (path == mount or mount in path.parents) and (
            best is None or len(part.mountpoint) > len(best.mountpoint)
        ):
            best = part
    return f"{best.device} at {best.mountpoint}" if best else "its device"


def disk_full(err: OSError, root: str, still_needs: int | None) -> DiskFull:
    """The one line for a write under `root` (the output) that found no space left; what to
    do and what is kept are the stop's to say (`regen.generation.stopped`)."""
    where = Path(err.filename) if isinstance(err.filename, str) else Path(root)
    existing = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    quota = " (quota)" if err.errno == errno.EDQUOT else ""
    need = f"; the run still needs about {byte_size(still_needs)}" if still_needs else ""
    return DiskFull(
        f"{root}: disk full{quota} on {_device(existing.resolve())}, which holds the output: "
        f"{byte_size(free)} free{need}"
    )
