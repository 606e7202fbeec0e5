"""A prompt file validated batch by batch into a PromptSet (or a quick PromptPreview).

A file is validated some `_BATCH_BYTES` at a time (JSONL cut at line ends, Parquet in row
slices), so a million-row file never has all its working columns in memory at once; only line,
id, reason, format and the usable rows' messages are kept, and duplicate ids are found across
the whole file at the end.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from regen.config import InputConfig
from regen.config.uris import is_hub
from regen.errors import UserError
from regen.prompts import hub, jsonl, parquet
from regen.prompts.facts import FileFacts, download, file_facts
from regen.prompts.formats import AS_NAMED, FORMAT, FORMAT_KEYS, Columns, format_name
from regen.prompts.rules import check_rows, row_format
from regen.prompts.sources import is_many, prompt_files

# Validation works on this much of the file at a time: its working columns take some ten times
# the batch, and freed batches' pages stay with the allocator a while, so smaller batches keep
# the peak down (8 MiB: 632 MB at a million prompts, 2 MiB: 503 MB); 512 KiB lowers the load's
# peak but not the plan stage's, and costs a quarter more time.
_BATCH_BYTES = 2 << 20

REJECTS_SCHEMA = pl.Schema({"line": pl.Int64, "id": pl.String, "reason": pl.String})


@dataclass(frozen=True)
class ReadOptions:
    """How the prompt set is read beyond its URI: the columns (`Columns`), and for a Hub
    dataset its split and subset and the token to read it with (None: huggingface_hub's own,
    `HF_TOKEN` or a saved login)."""

    columns: Columns = AS_NAMED
    split: str | None = None
    subset: str | None = None
    hf_token: str | None = field(default=None, repr=False)


def read_options(config: InputConfig, hf_token: str | None = None) -> ReadOptions:
    """The config's `input` section as the readers take it."""
    return ReadOptions(
        columns=Columns(id=config.id_column or "id", messages=config.messages_column),
        split=config.split,
        subset=config.subset,
        hf_token=hf_token,
    )


@dataclass(frozen=True)
class PromptSet:
    """Validated rows (`id`, `line`, `messages`, `tools`: JSON text or null, regen.tools) and
    the rejected ones (`line`, `id`, `reason`).

    `line` is the 1-based line of a JSONL file or the 1-based row of a Parquet file.
    `fingerprint` is the sha256 of the file's bytes: any edit of the input changes it.
    `formats` counts the valid rows of each format present, in `FORMAT_KEYS` order.
    `source` is where a Hub dataset was read from (`HubSelection.record`: its commit), and
    `path` is then the spec pinned to that commit.
    """

    path: str
    formats: dict[str, int]
    fingerprint: str
    valid: pl.DataFrame
    rejects: pl.DataFrame
    source: dict[str, Any] | None = None

    @property
    def format(self) -> str:
        return format_name(self.formats)

    @property
    def num_valid(self) -> int:
        return self.valid.height

    @property
    def num_rejected(self) -> int:
        return self.rejects.height


@dataclass(frozen=True)
class PromptPreview:
    """What a quick look at the first rows found, for the provisioning check."""

    path: str
    formats: dict[str, int]
    rows_checked: int
    valid: int
    rejected: int
    first_reason: str | None
    sampled: str = ""
    """How the rows were taken: `whole file`, or the windows of head, middle and tail."""
    sample: pl.DataFrame = field(default_factory=pl.DataFrame, repr=False, compare=False)
    """The valid rows checked (`id`, `line`, `messages`, `tools`), for figures per row."""

    @property
    def format(self) -> str:
        return format_name(self.formats)

    @property
    def with_tools(self) -> int:
        """Valid rows that carry `tools`: the servers need a tool-call parser for them."""
        return int(self.sample.get_column("tools").is_not_null().sum()) if self.valid else 0


def load_prompts(
    path_or_uri: str, *, max_prompt_bytes: int = 1_000_000, options: ReadOptions = ReadOptions()
) -> PromptSet:
    """Load a local path or an `s3://bucket/key` URL (downloaded to a temp file first), every
    file of a glob or prefix as one set (`regen.prompts.sources`), or a Hub dataset's files
    of one commit (`regen.prompts.hub`)."""
    columns = options.columns
    if is_hub(path_or_uri):
        return _load_hub(path_or_uri, max_prompt_bytes, options)
    if is_many(path_or_uri):
        files = prompt_files(path_or_uri)
        sets = [load_prompts(f, max_prompt_bytes=max_prompt_bytes, options=options) for f in files]
        return _one_set(path_or_uri, sets)
    if "://" not in path_or_uri:
        return load_prompts_file(
            Path(path_or_uri), max_prompt_bytes=max_prompt_bytes, columns=columns
        )
    with tempfile.TemporaryDirectory(prefix="regen-prompts-") as tmp:
        local = download(path_or_uri, Path(tmp))
        return load_prompts_file(
            local, max_prompt_bytes=max_prompt_bytes, name=path_or_uri, columns=columns
        )


def load_prompts_file(
    path: Path,
    *,
    max_prompt_bytes: int = 1_000_000,
    name: str | None = None,
    columns: Columns = AS_NAMED,
) -> PromptSet:
    """Validate a local file; `name` is how messages name it (default: the path)."""
    name = name or str(path)
    facts = file_facts(path, name)
    formats, valid, rejects = _load(path, name, facts, max_prompt_bytes, None, columns)
    return PromptSet(name, formats, facts.fingerprint, valid, rejects)


def preview(
    path_or_uri: str,
    n: int = 1000,
    *,
    max_prompt_bytes: int = 1_000_000,
    options: ReadOptions = ReadOptions(),
) -> PromptPreview:
    """Validate about `n` rows (of the first file of a glob, prefix or Hub selection, the only
    one downloaded), a third each from the head, the middle and the tail of the file, so rows
    broken at its end are seen too: cheap enough to run before any GPU is rented."""
    columns = options.columns
    if is_hub(path_or_uri):
        selection = _hub_selection(path_or_uri, options)
        first = replace(selection, files=selection.files[:1])
        (local,) = hub.download(first, options.hf_token)
        return _preview(local, selection.name(first.files[0].path), n, max_prompt_bytes, columns)
    if is_many(path_or_uri):
        path_or_uri = prompt_files(path_or_uri)[0]
    if "://" in path_or_uri:
        with tempfile.TemporaryDirectory(prefix="regen-prompts-") as tmp:
            local = download(path_or_uri, Path(tmp))
            return _preview(local, path_or_uri, n, max_prompt_bytes, columns)
    return _preview(Path(path_or_uri), path_or_uri, n, max_prompt_bytes, columns)


def _hub_selection(spec: str, options: ReadOptions) -> hub.HubSelection:
    return hub.resolve(spec, split=options.split, subset=options.subset, token=options.hf_token)


def _load_hub(spec: str, max_prompt_bytes: int, options: ReadOptions) -> PromptSet:
    """The selection's files, downloaded into huggingface_hub's cache and read as one set
    named by the spec pinned to its commit."""
    selection = _hub_selection(spec, options)
    local = hub.download(selection, options.hf_token)
    sets = [
        load_prompts_file(
            path,
            max_prompt_bytes=max_prompt_bytes,
            name=selection.name(file.path),
            columns=options.columns,
        )
        for file, path in zip(selection.files, local, strict=True)
    ]
    return replace(_one_set(selection.pinned, sets), source=selection.record())


def _preview(
    path: Path, name: str, n: int, max_prompt_bytes: int, columns: Columns
) -> PromptPreview:
    facts = file_facts(path, name, fingerprint=False)
    if facts.is_parquet:
        total, unit = parquet.row_count(path, name), "rows"
    else:  # a last line without a line end is a line too
        total, unit = facts.line_ends + (not _ends_with_newline(path)), "lines"
    windows = _windows(total, n)
    formats, valid, rejects = _load(path, name, facts, max_prompt_bytes, None, columns, windows)
    first = rejects.sort("line").row(0, named=True) if rejects.height else None
    sampled = (
        "whole file"
        if windows is None
        else f"sampled {unit} "
        + ", ".join(f"{s + 1:,}-{s + k:,}" for s, k in windows)
        + f" of {total:,}"
    )
    return PromptPreview(
        name,
        formats,
        valid.height + rejects.height,
        valid.height,
        rejects.height,
        f"{unit[:-1]} {first['line']}: {first['reason']}" if first else None,
        sampled,
        valid,
    )


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as fh:
        fh.seek(-1, 2)
        return fh.read(1) == b"\n"


def _windows(total: int, n: int) -> list[tuple[int, int]] | None:
    """(start, length) of head, middle and tail, `n` rows in all (a third each, the middle
    taking what does not divide); None when the file has no more than `n` rows (then it is
    read whole). They never overlap, since the file has more than `n` rows."""
    if total <= n:
        return None
    k = n // 3
    middle = n - 2 * k
    spans = [(0, k), ((total - middle) // 2, middle), (total - k, k)]
    return [span for span in spans if span[1]]


def _one_set(spec: str, sets: list[PromptSet]) -> PromptSet:
    """Files read one by one, joined in order as one set: an id a file before already has is
    rejected, naming that file; a reject's reason names its file (`line` is the file's)."""
    valid = pl.concat(
        [ps.valid.with_columns(_file=pl.lit(ps.path)) for ps in sets], how="vertical_relaxed"
    )
    first = valid.select(
        pl.col("_file").first().over("id").alias("first_file"),
        pl.col("line").first().over("id").alias("first_line"),
    )
    duplicate = pl.int_range(pl.len()).over("id") > 0
    marked = pl.concat([valid, first], how="horizontal").with_columns(_dup=duplicate)
    duplicates = marked.filter("_dup").select(
        "line",
        "id",
        pl.format(
            "{}: duplicate id (first in {} line {})", "_file", "first_file", "first_line"
        ).alias("reason"),
    )
    rejects = [
        ps.rejects.with_columns(pl.format("{}: {}", pl.lit(ps.path), "reason").alias("reason"))
        for ps in sets
    ]
    formats: dict[str, int] = {}
    for ps in sets:
        for fmt, count in ps.formats.items():
            formats[fmt] = formats.get(fmt, 0) + count
    digest = hashlib.sha256("\n".join(f"{ps.path}\t{ps.fingerprint}" for ps in sets).encode())
    return PromptSet(
        spec,
        {fmt: formats[fmt] for fmt in FORMAT_KEYS if fmt in formats},
        digest.hexdigest(),
        marked.filter(~pl.col("_dup")).select("id", "line", "messages", "tools"),
        pl.concat([*rejects, duplicates.cast(REJECTS_SCHEMA)]),
    )


def _parquet_bytes(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd")
    return buf.getvalue()


def _load(
    path: Path,
    name: str,
    facts: FileFacts,
    max_prompt_bytes: int,
    n_rows: int | None,
    columns: Columns,
    windows: list[tuple[int, int]] | None = None,
) -> tuple[dict[str, int], pl.DataFrame, pl.DataFrame]:
    """Validate batch by batch: only one batch's working columns are held at a time; of the
    rows checked only the usable ones (id, line, format, messages) and the rejects are kept.
    `windows`: only the rows of these (start, length) spans."""
    if facts.is_parquet:
        batches = parquet.batches(path, name, facts.size, n_rows, _BATCH_BYTES, columns, windows)
    elif path.suffix.lower() == ".parquet":
        raise UserError(f"{name}: not a Parquet file (no PAR1 magic bytes)")
    elif windows is not None:
        batches = jsonl.window_batches(path, name, facts.utf8, windows, columns)
    else:
        batches = jsonl.batches(path, name, facts.utf8, n_rows, _BATCH_BYTES, columns)
    valid_parts, reject_parts = [], []
    for fields in batches:
        valid, rejects = _checked_batch(fields, max_prompt_bytes)
        valid_parts.append(valid)
        reject_parts.append(rejects)
    if not valid_parts:
        raise UserError(f"{name}: no prompts (only blank lines)")
    # No rechunk: a second copy of every usable row would be the peak of the whole load.
    valid, duplicates = _split_duplicates(pl.concat(valid_parts, rechunk=False))
    rejects = pl.concat([*reject_parts, duplicates]).sort("line")
    counted = dict(valid.get_column("row_format").cast(pl.String).value_counts().iter_rows())
    formats = {fmt: counted[fmt] for fmt in FORMAT_KEYS if fmt in counted}
    if valid.height == 0:
        where = "row" if facts.is_parquet else "line"
        first = rejects.row(0, named=True)
        raise UserError(
            f"{name}: {where} {first['line']}: {first['reason']}; "
            f"no usable rows ({rejects.height} rejected)"
        )
    return formats, valid.select("id", "line", "messages", "tools"), rejects


def _checked_batch(
    fields: pl.DataFrame, max_prompt_bytes: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A batch's usable rows (id, line, row_format, messages) and its rejects."""
    checked = check_rows(fields.with_columns(row_format=row_format()), max_prompt_bytes)
    ok = pl.col("reason").is_null()
    valid = checked.filter(ok).select(
        "id", "line", pl.col("row_format").cast(FORMAT), "messages", "tools"
    )
    return valid, checked.filter(~ok).select("line", "id", "reason").cast(REJECTS_SCHEMA)


def _split_duplicates(valid: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A usable row whose id an earlier usable row has is rejected, naming that row's line.
    The common case (no duplicates) costs one pass over the ids; only a file with duplicates
    pays for a second copy of the usable rows."""
    first = valid.get_column("id").is_first_distinct()
    if first.all():
        return valid, pl.DataFrame(schema=REJECTS_SCHEMA)
    marked = valid.select("line", "id", pl.col("line").min().over("id").alias("first"))
    rejects = marked.filter(~first).select(
        "line", "id", pl.format("duplicate id (first on line {})", "first").alias("reason")
    )
    return valid.filter(first), rejects
