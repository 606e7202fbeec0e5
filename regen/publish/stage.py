"""The repo's files, made on local disk before any of them is uploaded.

The Hub repo mirrors one folder: `data/train-NNNNNN.parquet` (the `default` config: one
Parquet file per dataset shard, each ok row's whole conversation ending with its regenerated
answer), with `--tokenized` `tokenized/train-NNNNNN.parquet` (the hf-dataset export's rows:
the server's own token ids and the loss mask), the report's files under `report/`, and the
card. A shard's file is made again only when the shard changed (`Committed.identity`), as
the exporter does; its bytes are the same for the same rows, so an unchanged dataset stages
the same folder and uploads nothing. The record of what was staged sits beside the folder,
never in it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from regen.config import ExportOptions
from regen.dataset import AUDIT_MARKDOWN_KEY, AUDIT_REPORT_KEY, Committed
from regen.dataset.keys import REPORT_PREFIX
from regen.export.formats import conversation, shard_export
from regen.lossmask import ChatTemplate
from regen.schema import OUTPUT_MESSAGE, SAMPLING
from regen.storage import Storage
from regen.tools import template_tools

SPLIT = "train"
CONFIG_DIRS = {"default": "data", "tokenized": "tokenized"}
"""Each config's folder in the repo; its files are `<folder>/<split>-NNNNNN.parquet`."""
CARD = "README.md"
REPO_FOLDER = "repo"
RECORD = "staged.json"
VERSION = 1
"""Bumped when a staged file's bytes change for the same rows: every file is made again."""

CONVERSATION_SCHEMA: dict[str, pl.DataType] = (
    {
        "id": pl.String(),
        "messages": pl.List(OUTPUT_MESSAGE),
        "tools": pl.String(),
        "finish_reason": pl.String(),
        "prompt_tokens": pl.Int64(),
        "completion_tokens": pl.Int64(),
        "reasoning_tokens": pl.Int64(),
        "sampling": SAMPLING,
    }
)
"""The `default` config's columns, the same in every file (`datasets` reads one schema)."""
TOKENIZED_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String(),
    "input_ids": pl.List(pl.Int32),
    "loss_mask": pl.List(pl.Int8),
    "seq_len": pl.Int64(),
}


def data_file(config: str, shard: int) -> str:
    return f"{CONFIG_DIRS[config]}/{SPLIT}-{shard:06d}.parquet"


def data_pattern(config: str) -> str:
    """The card's `data_files` pattern of a config's split."""
    return f"{CONFIG_DIRS[config]}/{SPLIT}-*.parquet"


@dataclass
class ConfigCounts:
    """What one config holds: rows, and what was left out of it by reason."""

    rows: int = 0
    dropped: Counter[str] = field(default_factory=Counter)


@dataclass
class Staged:
    """The folder as staged: every file's sha256 and size by its path in the repo."""

    folder: Path
    files: dict[str, tuple[str, int]]
    counts: dict[str, ConfigCounts]
    written: int
    """Data files made in this call (the others were staged already)."""

    def add(self, path: str, data: bytes) -> None:
        """Put a small file (the card, a report file) into the folder."""
        _write(self.folder / path, data)
        self.files[path] = (hashlib.sha256(data).hexdigest(), len(data))


def stage_rows(
    storage: Storage,
    committed: Committed,
    staging: Path,
    *,
    tokenized: bool,
    template: ChatTemplate | None = None,
    enable_thinking: bool = True,
    workers: int | None = None,
) -> Staged:
    """Stage every committed shard's file of each config, made again only where the shard
    changed (the card and the report's files are the caller's to add)."""
    folder = staging / REPO_FOLDER
    options = {
        "version": VERSION,
        "dataset": storage.uri,
        "tokenized": tokenized,
        "template": str(template.path) if template is not None else None,
    }
    old = _read_record(staging / RECORD)
    previous: dict[str, Any] = old.get("files", {}) if old.get("options") == options else {}
    configs = ["default", "tokenized"] if tokenized else ["default"]
    entries: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, int]] = []
    for config in configs:
        for shard in committed.shards:
            path = data_file(config, shard)
            entry = previous.get(path)
            if (
                isinstance(entry, dict)
                and entry.get("identity") == committed.identity(shard)
                and (folder / path).is_file()
                and (folder / path).stat().st_size == entry.get("size")
            ):
                entries[path] = entry
            else:
                todo.append((config, shard))

    makers: dict[str, Callable[[pl.LazyFrame], tuple[pl.DataFrame, Counter[str]]]] = {
        "default": _conversations,
        "tokenized": lambda rows: _tokens(rows, template, enable_thinking),
    }

    def make(item: tuple[str, int]) -> tuple[str, dict[str, Any]]:
        config, shard = item
        frame, dropped = makers[config](committed.scan([shard]))
        data = _parquet(frame)
        path = data_file(config, shard)
        _write(folder / path, data)
        digest = hashlib.sha256(data).hexdigest()
        return path, {
            "identity": committed.identity(shard),
            "sha256": digest,
            "size": len(data),
            "rows": frame.height,
            "dropped": dict(sorted(dropped.items())),
        }

    with ThreadPoolExecutor(max_workers=workers or min(4, os.cpu_count() or 1)) as pool:
        for path, entry in pool.map(make, todo):
            entries[path] = entry
    _write(staging / RECORD, json.dumps({"options": options, "files": entries}, indent=2).encode())

    counts = {config: ConfigCounts() for config in configs}
    for path, entry in entries.items():
        config = next(c for c, d in CONFIG_DIRS.items() if path.startswith(f"{d}/"))
        counts[config].rows += entry["rows"]
        counts[config].dropped.update(entry["dropped"])
    return Staged(
        folder,
        {p: (e["sha256"], e["size"]) for p, e in sorted(entries.items())},
        counts,
        written=len(todo),
    )


def finish_folder(staged: Staged) -> None:
    """Remove what the folder holds that this staging did not put there (a shard no longer
    committed, a config no longer asked for): the folder is exactly the repo's files."""
    for path in sorted(staged.folder.rglob("*"), reverse=True):
        rel = path.relative_to(staged.folder).as_posix()
        if path.is_file() and rel not in staged.files:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def report_keys(storage: Storage) -> list[str]:
    """The report's files a published repo carries besides the provenance (which the
    publisher brings up to date): the audit (JSON and Markdown, which shows the plots by
    relative link) and the plots."""
    present = set(storage.list(REPORT_PREFIX))
    wanted = [AUDIT_REPORT_KEY, AUDIT_MARKDOWN_KEY]
    plots = sorted(k for k in present if k.endswith(".png"))
    return [k for k in wanted if k in present] + plots


def _conversations(rows: pl.LazyFrame) -> tuple[pl.DataFrame, Counter[str]]:
    """Each ok row's whole conversation ending with its answer (the exporter's
    `conversation`, every message kept: the context is what the server saw), its tools as the
    server handed them to the template, its finish reason, token counts and sampling."""
    answer_calls = pl.col("turns").list.last().struct.field("tool_calls")
    frame = (
        rows.filter(pl.col("error").is_null())
        .with_columns(answer_calls.alias("_answer_calls"))
        .select(
            "id",
            conversation(answer_calls=True).alias("messages"),
            pl.col("tools").map_elements(_tools, return_dtype=pl.String, skip_nulls=True),
            "finish_reason",
            "prompt_tokens",
            "completion_tokens",
            "reasoning_tokens",
            "sampling",
        )
        .collect()
    )
    return frame.cast(pl.Schema(CONVERSATION_SCHEMA)), Counter()


def _tools(text: str) -> str:
    return json.dumps(template_tools(json.loads(text)), ensure_ascii=False)


def _tokens(
    rows: pl.LazyFrame, template: ChatTemplate | None, enable_thinking: bool
) -> tuple[pl.DataFrame, Counter[str]]:
    """The hf-dataset export's rows of the shard: one sample per assistant turn."""
    made = shard_export(
        rows, ExportOptions(format="hf-dataset"), template, enable_thinking=enable_thinking
    )
    dropped = Counter({k: v for k, v in made.dropped.items() if v})
    return made.frame.cast(pl.Schema(TOKENIZED_SCHEMA)), dropped


def _parquet(frame: pl.DataFrame) -> bytes:
    """The same rows give the same bytes (no timestamp in polars' Parquet): an unchanged
    shard's file has the sha256 the Hub already holds."""
    buffer = io.BytesIO()
    frame.write_parquet(buffer, compression="zstd", statistics=True)
    return buffer.getvalue()


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: a temp file renamed (an interrupted staging leaves no half file
    that the next one would take as staged)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    temp.replace(path)


def _read_record(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
