"""Where the weights come from: a directory, an S3 prefix or a Hugging Face Hub repo. Each
lists its files (with what it knows to verify them by) and brings a list of them into the
target, handing every finished file to the caller's `place`, which verifies and renames it."""

from __future__ import annotations

import glob
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from boto3.s3.transfer import TransferConfig

from regen.errors import UserError
from regen.hub_errors import hub_errors
from regen.staging.layout import HUB_DOWNLOAD, SourceFile, hidden, part_path
from regen.storage.s3 import S3Storage, parse_s3_url

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # boto3-stubs[s3], a dev dependency

# Verifies a file written at the path and moves it to its place in the target.
Place = Callable[[SourceFile, Path], None]


class ModelSource(Protocol):
    """Where the weights come from."""

    def list_files(self) -> list[SourceFile]: ...

    def copy(
        self,
        files: list[SourceFile],
        target: Path,
        workers: int,
        progress: Callable[[int], None],
        place: Place,
    ) -> None:
        """Bring `files` into `target`, `workers` at a time, each finished one through `place`."""


class _FileByFile:
    """A source read one file at a time: `workers` threads, each file fetched to its part name
    beside its place, then placed."""

    def copy(
        self,
        files: list[SourceFile],
        target: Path,
        workers: int,
        progress: Callable[[int], None],
        place: Place,
    ) -> None:
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="stage") as pool:
            futures = [pool.submit(self._copy_one, target, f, progress, place) for f in files]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise

    def _copy_one(
        self, target: Path, file: SourceFile, progress: Callable[[int], None], place: Place
    ) -> None:
        dest = target / file.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = part_path(dest)
        try:
            self._fetch(file, part, progress)
            place(file, part)
        finally:
            part.unlink(missing_ok=True)

    def _fetch(self, file: SourceFile, dest: Path, progress: Callable[[int], None]) -> None:
        """Write the file's bytes to `dest`, reporting bytes to `progress` as they arrive."""
        raise NotImplementedError


class LocalSource(_FileByFile):
    """A directory; size and mtime stand in for a checksum, as hashing would double the I/O."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def list_files(self) -> list[SourceFile]:
        files = []
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root)
            if path.is_file() and not hidden(rel.as_posix()):
                stat = path.stat()
                files.append(
                    SourceFile(name=rel.as_posix(), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
                )
        return files

    def _fetch(self, file: SourceFile, dest: Path, progress: Callable[[int], None]) -> None:
        # copyfile uses sendfile(2) on Linux: kernel-to-kernel, as fast as cp.
        shutil.copyfile(self.root / file.name, dest)
        progress(file.size)


class S3Source(_FileByFile):
    """An S3 prefix; single-part ETags (an MD5) are checked after download."""

    def __init__(self, storage: S3Storage, transfer: TransferConfig) -> None:
        self.storage = storage
        self.transfer = transfer

    def list_files(self) -> list[SourceFile]:
        return [
            SourceFile(name=o.key, size=o.size, etag=o.etag)
            for o in self.storage.list_objects()
            if not o.key.endswith("/") and not hidden(o.key)
        ]

    def _fetch(self, file: SourceFile, dest: Path, progress: Callable[[int], None]) -> None:
        self.storage.download(file.name, dest, self.transfer, progress)


class HubSource:
    """A Hugging Face Hub repo pinned to the commit its listing came from; huggingface_hub's
    `snapshot_download` fetches the files (its own worker pool, retries and Xet transfers)."""

    def __init__(self, repo_id: str, revision: str | None, token: str | None) -> None:
        self.repo_id = repo_id
        self.revision = revision
        self.token = token
        self._commit: str | None = None

    def list_files(self) -> list[SourceFile]:
        from huggingface_hub import HfApi

        with hub_errors(f"hf://{self.repo_id}", self.revision, self.token):
            info = HfApi(token=self.token).model_info(
                self.repo_id, revision=self.revision, files_metadata=True
            )
        self._commit = info.sha
        return [
            SourceFile(
                name=s.rfilename,
                size=s.size or 0,
                sha256=s.lfs.sha256 if s.lfs is not None else None,
            )
            for s in info.siblings or []
            if not hidden(s.rfilename)
        ]

    def copy(
        self,
        files: list[SourceFile],
        target: Path,
        workers: int,
        progress: Callable[[int], None],
        place: Place,
    ) -> None:
        from huggingface_hub import snapshot_download

        # Inside the target, so each file is renamed into place on the same filesystem. It is
        # kept when the download fails: huggingface_hub's own metadata in it lets the next
        # staging skip the files that arrived, as a file-by-file copy would.
        scratch = target / HUB_DOWNLOAD
        with hub_errors(f"hf://{self.repo_id}", self.revision, self.token):
            snapshot_download(
                self.repo_id,
                revision=self._commit or self.revision,
                token=self.token,
                local_dir=scratch,
                # Only the files still to copy; escaped, as the patterns are fnmatch globs.
                allow_patterns=[glob.escape(f.name) for f in files],
                max_workers=max(1, workers),
            )
        for file in files:
            place(file, scratch / file.name)
            progress(file.size)
        shutil.rmtree(scratch, ignore_errors=True)


def open_source(
    source: str,
    revision: str | None = None,
    hf_token: str | None = None,
    s3_client_factory: Callable[[], S3Client] | None = None,
) -> ModelSource:
    """The `ModelSource` for a local directory, `s3://bucket/prefix` or `hf://org/repo`."""
    if source.startswith("s3://"):
        if s3_client_factory is None:
            storage = S3Storage.from_url(source)
        else:
            storage = S3Storage(*parse_s3_url(source), s3_client_factory)
        # A few ranged GETs per file on top of `workers` files at once fill a fast link.
        transfer = TransferConfig(
            multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4
        )
        return S3Source(storage, transfer)
    if source.startswith("hf://"):
        return HubSource(source.removeprefix("hf://").strip("/"), revision, hf_token)
    if "://" in source:
        raise UserError(f"{source}: unsupported model source (use a directory, s3:// or hf://)")
    root = Path(source).expanduser()
    if not root.is_dir():
        raise UserError(f"{source}: model directory does not exist")
    return LocalSource(root)
