"""The dataset root behind one small interface: a local directory or an S3 prefix.

Everything that writes the dataset goes through `Storage`, so the commit protocol
(data first, manifest last) is written once and holds on both back ends.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from regen.errors import UserError


@runtime_checkable
class Storage(Protocol):
    """Keys are '/'-separated paths relative to the dataset root."""

    uri: str

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write atomically: a reader sees the old object, the new one, or none."""

    def read_bytes(self, key: str) -> bytes:
        """Raise FileNotFoundError when the key does not exist."""

    def exists(self, key: str) -> bool: ...

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Write only if `key` does not exist, atomically: True if created, False if it existed.

        Claims between nodes rest on this: of many racers exactly one creates a key.
        """

    def list(self, prefix: str = "") -> list[str]:
        """Keys under `prefix`, sorted."""

    def delete(self, key: str) -> None:
        """Delete; a missing key is not an error."""

    def put_file(self, key: str, path: Path) -> None:
        """Publish the finished local file `path` as `key`, atomically, streamed from disk
        (an export's single file is larger than memory, and than one S3 PUT's 5 GB)."""

    def polars_path(self, key: str) -> str:
        """A path or URL polars can scan (a glob is allowed)."""

    def polars_options(self) -> dict[str, Any] | None:
        """`storage_options` for polars, or None for local files."""


class LocalStorage:
    """A directory; writes go to a temp file in the same directory, fsync, then os.replace."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def _write_temp(self, path: Path, data: bytes) -> str:
        """A complete, fsynced temp file beside `path` (mkstemp is O_CREAT|O_EXCL)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            # mkstemp creates 0600; the dataset should follow the user's umask like any file.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return tmp

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_file(self, key: str, path: Path) -> None:
        """Moved into place when `path` is on the same filesystem (a temp file under the
        root), else copied beside it first; either way the rename is what readers see."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(path, 0o666 & ~umask)
            os.replace(path, target)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            try:
                shutil.copyfile(path, tmp)
                os.chmod(tmp, 0o666 & ~umask)
                os.replace(tmp, target)
            finally:
                Path(tmp).unlink(missing_ok=True)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            # link() fails if the name exists and, unlike O_EXCL on the final name, publishes
            # the file only once it is complete: no racer ever reads a half-written claim.
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)
        return True

    def read_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix)
        if prefix and not prefix.endswith("/"):
            base = base.parent
        if not base.is_dir():
            return []
        keys = (p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix) and not Path(k).name.startswith("."))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def polars_path(self, key: str) -> str:
        return str(self._path(key))

    def polars_options(self) -> dict[str, Any] | None:
        return None


def open_storage(uri: str) -> Storage:
    """A `Storage` for a directory path or an `s3://bucket/prefix` URL."""
    if uri.startswith("s3://"):
        from regen.storage.s3 import S3Storage

        return S3Storage.from_url(uri)
    if "://" in uri:
        raise UserError(f"{uri}: unsupported storage URL (use a directory or s3://bucket/prefix)")
    return LocalStorage(Path(uri))


def probe(storage: Storage) -> None:
    """Write, read back and delete one object, so a wrong root fails before any server starts."""
    key = f".regen-probe-{uuid.uuid4().hex}"
    payload = key.encode()
    try:
        storage.write_bytes(key, payload)
        try:
            if storage.read_bytes(key) != payload:
                raise UserError(f"{storage.uri}: a probe object read back different bytes")
        finally:
            storage.delete(key)
    except OSError as err:
        # S3 failures are UserErrors already; this names a local root that cannot be written.
        raise UserError(f"{storage.uri}: not writable ({err.strerror or err})") from err


def honours_exclusive(storage: Storage) -> bool:
    """Whether the store's conditional create works: a second `create_exclusive` of one key
    must be refused. The output's lease and the multi-node shard claims rest on it, and an S3
    stand-in that ignores `If-None-Match: *` says nothing: both racers "win" in silence. One
    probe key, deleted after."""
    key = f".regen-probe-exclusive-{uuid.uuid4().hex}"
    try:
        if not storage.create_exclusive(key, b"first"):
            raise UserError(f"{storage.uri}: a conditional create of the new key {key} failed")
        return not storage.create_exclusive(key, b"second")
    except OSError as err:  # a local file system without hard links (some FUSE mounts)
        raise UserError(
            f"{storage.uri}: no conditional create here ({err.strerror or err})"
        ) from err
    finally:
        storage.delete(key)
