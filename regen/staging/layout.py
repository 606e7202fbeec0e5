"""What a staged model looks like on disk: its files as the source lists them, the marker that
names them, the part names a copy writes before its rename, and the files SGLang needs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel

from regen.errors import UserError

MARKER_NAME = ".regen-staged.json"
# Everything unfinished carries this suffix, so one sweep removes an interrupted copy's leftovers.
PART_SUFFIX = ".regen-part"
# Where huggingface_hub downloads a Hub model's files before each is verified and renamed.
HUB_DOWNLOAD = ".regen-hub-download"


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


TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "chat_template.json",
        "generation_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
    }
)
"""What the audit and the export read of a model (its tokenizer and chat template): all a
machine that runs no server needs (a multi-node run's parent), a few MB of a model's GBs."""


def part_path(dest: Path) -> Path:
    """Where a file is written before it is verified and renamed to `dest`."""
    return dest.with_name(f".{dest.name}{PART_SUFFIX}")


def hidden(name: str) -> bool:
    """Dot-directories are tool caches (.cache/huggingface, .git) and our own marker."""
    return any(part.startswith(".") for part in name.split("/"))


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


def check_index(target: Path, names: set[str], source: str) -> None:
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
