"""Model staging: the weights copied once to a RAM disk, verified, so servers load in seconds.

The marker file is written last and names every file with its size: a directory without a
valid marker is never reported as staged, and a second staging of the same source is a no-op.
An interrupted copy is completed, file by file, on the next call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import psutil
from boto3.s3.transfer import TransferConfig
from pydantic import BaseModel, ValidationError, computed_field

from regen.errors import UserError
from regen.filesystems import existing_parent, fs_type
from regen.s3 import S3Storage, parse_s3_url

if TYPE_CHECKING:
    from botocore.client import BaseClient

MARKER_NAME = ".regen-staged.json"
_PART_SUFFIX = ".regen-part"
_HASH_CHUNK = 8 << 20


class SourceFile(BaseModel):
    """One file of the model; `name` is relative to the model root with '/' separators."""

    name: str
    size: int
    etag: str | None = None
    sha256: str | None = None
    mtime_ns: int | None = None


class StageMarker(BaseModel):
    """What `.regen-staged.json` records: enough to tell a complete staging from a stale one."""

    source: str
    revision: str | None
    files: list[SourceFile]
    finished_at: datetime


class StageResult(BaseModel):
    """`bytes`/`files` describe the whole model; `copied_*` what this call had to copy."""

    path: Path
    bytes: int
    files: int
    copied_bytes: int
    copied_files: int
    seconds: float
    skipped: bool

    @computed_field  # type: ignore[prop-decorator]
    @property
    def throughput(self) -> float:
        """Bytes per second copied by this call."""
        return self.copied_bytes / self.seconds if self.seconds > 0 else 0.0


class ModelSource(Protocol):
    """Where the weights come from."""

    def list_files(self) -> list[SourceFile]: ...

    def fetch(self, file: SourceFile, dest: Path, progress: Callable[[int], None]) -> None:
        """Write the file's bytes to `dest` (a temp name the caller renames)."""


class LocalSource:
    """A directory; size and mtime stand in for a checksum, as hashing would double the I/O."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def list_files(self) -> list[SourceFile]:
        files = []
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root)
            if path.is_file() and not _hidden(rel.as_posix()):
                stat = path.stat()
                files.append(
                    SourceFile(name=rel.as_posix(), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
                )
        return files

    def fetch(self, file: SourceFile, dest: Path, progress: Callable[[int], None]) -> None:
        # copyfile uses sendfile(2) on Linux: kernel-to-kernel, as fast as cp.
        shutil.copyfile(self.root / file.name, dest)
        progress(file.size)


class S3Source:
    """An S3 prefix; single-part ETags (an MD5) are checked after download."""

    def __init__(self, storage: S3Storage, transfer: TransferConfig) -> None:
        self.storage = storage
        self.transfer = transfer

    def list_files(self) -> list[SourceFile]:
        return [
            SourceFile(name=o.key, size=o.size, etag=o.etag)
            for o in self.storage.list_objects()
            if not o.key.endswith("/") and not _hidden(o.key)
        ]

    def fetch(self, file: SourceFile, dest: Path, progress: Callable[[int], None]) -> None:
        self.storage.download(file.name, dest, self.transfer, progress)


class HubSource:
    """A Hugging Face Hub repo pinned to the commit its listing came from."""

    def __init__(self, repo_id: str, revision: str | None, token: str | None) -> None:
        self.repo_id = repo_id
        self.revision = revision
        self.token = token
        self._commit: str | None = None

    def list_files(self) -> list[SourceFile]:
        from huggingface_hub import HfApi

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
            if not _hidden(s.rfilename)
        ]

    def fetch(self, file: SourceFile, dest: Path, progress: Callable[[int], None]) -> None:
        from huggingface_hub import hf_hub_download

        scratch = dest.with_name(f"{dest.name}.hf")
        downloaded = hf_hub_download(
            self.repo_id,
            file.name,
            revision=self._commit or self.revision,
            token=self.token,
            local_dir=scratch,
        )
        os.replace(downloaded, dest)
        shutil.rmtree(scratch, ignore_errors=True)
        progress(file.size)


def open_source(
    source: str,
    revision: str | None = None,
    hf_token: str | None = None,
    s3_client_factory: Callable[[], BaseClient] | None = None,
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


def missing_model_files(names: Iterable[str]) -> list[str]:
    """What SGLang needs at the model root and `names` lacks, in words for the user."""
    top = {n for n in names if "/" not in n}
    missing = []
    if "config.json" not in top:
        missing.append("config.json")
    if not any(n.endswith((".safetensors", ".bin")) for n in top):
        missing.append("weights (*.safetensors or *.bin)")
    has_tokenizer = (
        bool({"tokenizer.json", "tokenizer.model"} & top)
        or {
            "vocab.json",
            "merges.txt",
        }
        <= top
    )
    if not has_tokenizer:
        missing.append("tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt)")
    if "tokenizer_config.json" not in top:
        missing.append("tokenizer_config.json")
    return missing


def stage_model(
    source: str,
    target: Path,
    *,
    revision: str | None = None,
    hf_token: str | None = None,
    margin_bytes: int = 2 << 30,
    workers: int = 8,
    progress: Callable[[int, int], None] | None = None,
    s3_client_factory: Callable[[], BaseClient] | None = None,
) -> StageResult:
    """Copy the model at `source` to `target` unless a valid marker says it is already there.

    `progress(done_bytes, total_bytes)` is called from worker threads as bytes arrive.
    """
    started = time.monotonic()
    model = open_source(source, revision, hf_token, s3_client_factory)
    files = model.list_files()
    if not files:
        raise UserError(f"{source}: no files to stage")
    missing = missing_model_files(f.name for f in files)
    if missing:
        raise UserError(f"{source}: not a model SGLang can load, missing {', '.join(missing)}")
    target = target.expanduser().absolute()
    total = sum(f.size for f in files)
    previous = _read_marker(target)
    todo = [f for f in files if not _staged(target, f, previous, source, revision)]
    if not todo and _same_staging(previous, source, revision):
        return StageResult(
            path=target,
            bytes=total,
            files=len(files),
            copied_bytes=0,
            copied_files=0,
            seconds=time.monotonic() - started,
            skipped=True,
        )
    need = sum(f.size for f in todo)
    check_space(target, need, margin_bytes, reclaimable=_present_bytes(target, todo))
    _clear(target, todo, previous, {f.name for f in files})
    _copy_all(model, target, todo, workers, _Progress(total, total - need, progress), source)
    _check_index(target, {f.name for f in files}, source)
    _write_marker(
        target,
        StageMarker(source=source, revision=revision, files=files, finished_at=datetime.now(UTC)),
    )
    return StageResult(
        path=target,
        bytes=total,
        files=len(files),
        copied_bytes=need,
        copied_files=len(todo),
        seconds=time.monotonic() - started,
        skipped=False,
    )


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


class _Progress:
    """Thread-safe byte counter feeding the caller's callback."""

    def __init__(self, total: int, done: int, callback: Callable[[int, int], None] | None):
        self.total = total
        self.done = done
        self.callback = callback
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            done = self.done
        if self.callback is not None:
            self.callback(done, self.total)


def _copy_all(
    model: ModelSource,
    target: Path,
    todo: list[SourceFile],
    workers: int,
    progress: _Progress,
    source: str,
) -> None:
    target.mkdir(parents=True, exist_ok=True)
    # Largest first: the long copies start at once and the small ones fill in around them.
    ordered = sorted(todo, key=lambda f: f.size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="stage") as pool:
        futures = [pool.submit(_copy_one, model, target, f, progress, source) for f in ordered]
        try:
            for future in futures:
                future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _copy_one(
    model: ModelSource, target: Path, file: SourceFile, progress: _Progress, source: str
) -> None:
    dest = target / file.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}{_PART_SUFFIX}")
    try:
        model.fetch(file, part, progress.add)
        _verify(part, file, source)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def _verify(path: Path, file: SourceFile, source: str) -> None:
    size = path.stat().st_size
    if size != file.size:
        raise UserError(f"{source}/{file.name}: copied {size} bytes, the source lists {file.size}")
    # A multipart ETag ("<md5>-<parts>") is not the file's MD5; only a plain one can be checked.
    if file.etag is not None and len(file.etag) == 32 and "-" not in file.etag:
        digest = _digest(path, "md5")
        if digest != file.etag:
            raise UserError(f"{source}/{file.name}: MD5 {digest} does not match ETag {file.etag}")
    if file.sha256 is not None:
        digest = _digest(path, "sha256")
        if digest != file.sha256:
            raise UserError(f"{source}/{file.name}: sha256 does not match the Hub's")


def _digest(path: Path, algorithm: str) -> str:
    # Integrity, not security: md5 is what S3 reports for a single-part object.
    hasher = hashlib.new(algorithm, usedforsecurity=False)
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def _check_index(target: Path, names: set[str], source: str) -> None:
    """A sharded checkpoint's index must not point at a shard the source lacks."""
    index = target / "model.safetensors.index.json"
    if not index.is_file():
        return
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{source}/model.safetensors.index.json: unreadable ({err})") from err
    absent = sorted(shards - names)
    if absent:
        raise UserError(f"{source}: model.safetensors.index.json names missing {absent[0]}")


def _same_staging(marker: StageMarker | None, source: str, revision: str | None) -> bool:
    return marker is not None and marker.source == source and marker.revision == revision


def _staged(
    target: Path, file: SourceFile, marker: StageMarker | None, source: str, revision: str | None
) -> bool:
    """Present with the right size and, if a marker exists, recorded from this very source file."""
    path = target / file.name
    if not path.is_file() or path.stat().st_size != file.size:
        return False
    if marker is None:
        # An interrupted run. Files only appear by rename after verification, and replaced ones
        # are deleted before the marker is, so a present file of the right size is this source's.
        return True
    return _same_staging(marker, source, revision) and file in marker.files


def _present_bytes(target: Path, files: list[SourceFile]) -> int:
    return sum(p.stat().st_size for f in files if (p := target / f.name).is_file())


def _clear(
    target: Path, todo: list[SourceFile], previous: StageMarker | None, names: set[str]
) -> None:
    """Remove what is about to be replaced, then the marker: an interruption leaves no stale file
    that a later run could mistake for a copied one."""
    for file in todo:
        (target / file.name).unlink(missing_ok=True)
    if previous is not None:
        # Files an older staging put there and this source no longer has (a re-sharded model).
        for file in previous.files:
            if file.name not in names:
                (target / file.name).unlink(missing_ok=True)
    (target / MARKER_NAME).unlink(missing_ok=True)
    if target.is_dir():
        # Leftovers of an interrupted copy: part files and the Hub's per-file download dirs.
        for part in sorted(target.rglob(f"*{_PART_SUFFIX}*"), reverse=True):
            if part.is_dir():
                shutil.rmtree(part, ignore_errors=True)
            else:
                part.unlink(missing_ok=True)


def _read_marker(target: Path) -> StageMarker | None:
    try:
        return StageMarker.model_validate_json((target / MARKER_NAME).read_bytes())
    except (OSError, ValidationError):
        return None


def _write_marker(target: Path, marker: StageMarker) -> None:
    tmp = target / f"{MARKER_NAME}{_PART_SUFFIX}"
    tmp.write_text(marker.model_dump_json(indent=2))
    os.replace(tmp, target / MARKER_NAME)


def _hidden(name: str) -> bool:
    # Dot-directories are tool caches (.cache/huggingface, .git) and our own marker.
    return any(part.startswith(".") for part in name.split("/"))


def _gb(nbytes: int) -> str:
    gb = nbytes / 1e9
    # Small figures keep two digits so a toy model does not read "needs 0.0 GB".
    return f"{gb:.1f}" if gb >= 0.1 else f"{gb:.2g}"
