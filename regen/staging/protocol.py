"""The copy protocol: what is already staged, what to copy, each file verified before its
rename, the marker written last.

The marker names every file with its size: a directory without a valid marker is never reported
as staged, and a second staging of the same source is a no-op. An interrupted copy is completed,
file by file, on the next call.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError, computed_field

from regen.errors import UserError
from regen.staging.layout import (
    MARKER_NAME,
    PART_SUFFIX,
    TOKENIZER_FILES,
    SourceFile,
    StageMarker,
    check_index,
    missing_model_files,
)
from regen.staging.sources import ModelSource, open_source
from regen.staging.space import check_space

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # boto3-stubs[s3], a dev dependency

_HASH_CHUNK = 8 << 20


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


def stage_model(
    source: str,
    target: Path,
    *,
    revision: str | None = None,
    hf_token: str | None = None,
    margin_bytes: int = 2 << 30,
    workers: int = 8,
    progress: Callable[[int, int], None] | None = None,
    s3_client_factory: Callable[[], S3Client] | None = None,
    tokenizer_only: bool = False,
) -> StageResult:
    """Copy the model at `source` to `target` unless a valid marker says it is already there.

    `progress(done_bytes, total_bytes)` is called from worker threads as bytes arrive.
    `tokenizer_only`: the tokenizer and chat template files alone (`TOKENIZER_FILES`), to a
    target of their own (the marker names what was copied).
    """
    started = time.monotonic()
    model = open_source(source, revision, hf_token, s3_client_factory)
    files = model.list_files()
    if tokenizer_only:
        files = [f for f in files if f.name in TOKENIZER_FILES]
        if not any(f.name == "tokenizer.json" for f in files):
            raise UserError(f"{source}: no tokenizer.json to read the model's tokenizer from")
    if not files:
        raise UserError(f"{source}: no files to stage")
    missing = [] if tokenizer_only else missing_model_files(f.name for f in files)
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
    check_index(target, {f.name for f in files}, source)
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

    def place(file: SourceFile, written: Path) -> None:
        # A file appears under its own name only once verified: what is there is whole. One
        # that fails goes, so that no later staging resumes from its bytes.
        try:
            _verify(written, file, source)
        except UserError:
            written.unlink(missing_ok=True)
            raise
        dest = target / file.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(written, dest)

    # Largest first: the long copies start at once and the small ones fill in around them.
    ordered = sorted(todo, key=lambda f: f.size, reverse=True)
    model.copy(ordered, target, workers, progress.add, place)


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
        # Leftovers of an interrupted copy (the Hub's download directory is resumed instead).
        for part in target.rglob(f"*{PART_SUFFIX}"):
            part.unlink(missing_ok=True)


def _read_marker(target: Path) -> StageMarker | None:
    try:
        return StageMarker.model_validate_json((target / MARKER_NAME).read_bytes())
    except (OSError, ValidationError):
        return None


def _write_marker(target: Path, marker: StageMarker) -> None:
    tmp = target / f"{MARKER_NAME}{PART_SUFFIX}"
    tmp.write_text(marker.model_dump_json(indent=2))
    os.replace(tmp, target / MARKER_NAME)
