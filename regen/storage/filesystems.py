"""Facts about the file system under a path: where a copy would land, and what kind it is."""

from __future__ import annotations

from pathlib import Path

import psutil


def existing_parent(path: Path) -> Path:
    """`path` or its nearest ancestor that exists: where free space is measured before mkdir."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def fs_type(path: Path) -> str:
    """The mount type holding `path` (longest matching mount point), e.g. tmpfs, nfs4, ext4."""
    resolved = path.resolve()
    best, kind = "", "unknown"
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        if (resolved == Path(mount) or Path(mount) in resolved.parents) and len(mount) > len(best):
            best, kind = mount, part.fstype
    return kind
