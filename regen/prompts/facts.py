"""What a prompt file is before any row is read: its fingerprint, Parquet or text, and
whether the text is UTF-8 without NUL bytes; and a remote file fetched to a local one."""

from __future__ import annotations

import codecs
import hashlib
from dataclasses import dataclass
from pathlib import Path

from regen.errors import UserError
from regen.storage import open_storage

_HASH_CHUNK = 1 << 20
_PARQUET_MAGIC = b"PAR1"


@dataclass(frozen=True)
class FileFacts:
    """What one streamed pass over the bytes found; `fingerprint` is empty when not asked for."""

    fingerprint: str
    size: int
    is_parquet: bool
    utf8: bool
    nul_line: int | None
    line_ends: int = 0
    """Newlines in a text file (its lines, less one when the last has no line end)."""


def file_facts(path: Path, name: str, *, fingerprint: bool = True) -> FileFacts:
    """One streamed pass over the bytes: the fingerprint, and whether the file is text at all."""
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")()
    size, lines, utf8, nul_line = 0, 0, True, None
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_PARQUET_MAGIC))
            fh.seek(0)
            is_parquet = head == _PARQUET_MAGIC
            while chunk := fh.read(_HASH_CHUNK):
                size += len(chunk)
                if fingerprint:
                    digest.update(chunk)
                if is_parquet:
                    continue
                if nul_line is None and (nul := chunk.find(b"\x00")) >= 0:
                    nul_line = lines + chunk.count(b"\n", 0, nul) + 1
                lines += chunk.count(b"\n")
                if utf8:
                    try:
                        decoder.decode(chunk)
                    except UnicodeDecodeError:
                        utf8 = False
                if not fingerprint and nul_line is not None:
                    break
    except FileNotFoundError:
        raise UserError(f"{name}: prompt file not found") from None
    except IsADirectoryError:
        raise UserError(f"{name}: is a directory, expected a JSONL or Parquet file") from None
    except OSError as err:
        raise UserError(f"{name}: cannot read: {err.strerror}") from None
    if size == 0:
        raise UserError(f"{name}: file is empty")
    if nul_line is not None:
        raise UserError(f"{name}: line {nul_line}: binary data (a NUL byte), not JSONL or Parquet")
    return FileFacts(digest.hexdigest(), size, is_parquet, utf8, nul_line, lines)


def download(uri: str, tmp: Path) -> Path:
    """A remote prompt file copied into `tmp`: the readers work on a local file's bytes."""
    root, _, key = uri.rpartition("/")
    if not key or root.endswith(":/"):
        raise UserError(f"{uri}: not a file URL (expected s3://bucket/path/prompts.jsonl)")
    try:
        data = open_storage(root).read_bytes(key)
    except FileNotFoundError:
        raise UserError(f"{uri}: prompt file not found") from None
    local = tmp / key
    local.write_bytes(data)
    return local
