"""Export a dataset's committed rows to a trainer's format, shard by shard, incrementally.

One output file per dataset shard, each written whole through `Storage.write_bytes` (a temp
file renamed locally, a single PUT on S3), so a reader never sees half a file and memory
holds one shard at a time per worker. `.regen-export` (JSON) is written after the files: it
names the format and options, the dataset's fingerprint, every manifest the files were made
from and the counts. A rerun compares each committed shard's manifest with the one recorded and
rewrites only the shards that changed; on an unchanged dataset it writes nothing at all.

The record is a hidden file without a .json suffix because the directory is the trainers'
input: `load_dataset(DIR)` skips hidden files, and speculators' `--data DIR` reads every
`*.json`/`*.jsonl` under it (an `export.json` there broke both). A single-file export
(`single_file`) streams the shards, in order, into one `<format>.jsonl` on local disk, then
published by `Storage.put_file` (uploaded from disk on S3): SpecForge opens one file, never a
directory or a glob.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from regen.config import TOKEN_FORMATS, ExportOptions
from regen.dataset import (
    AUDIT_REPORT_KEY,
    Committed,
    read_committed,
    read_run,
    require_dataset,
    run_fingerprint_of,
    thinking_mode,
)
from regen.errors import ConfigError, UserError
from regen.export.formats import ShardExport, shard_export
from regen.lossmask import load_template
from regen.storage import LocalStorage, Storage

EXPORT_KEY = ".regen-export"
LEGACY_EXPORT_KEY = "export.json"
"""Where VERSION 1 kept the record; read once to take over (and delete) an older export."""
VERSION = 2
"""Bumped when a format's bytes change, so a rerun rewrites files made by older code."""
TOKEN_FREQ = "token_freq.pt"
EXACT_PATH = (
    "SpecForge reproduces the server's tokens exactly only through the pre-tokenized path: "
    "the tokenized export as data.prompts_path"
)
HF_STATE = "state.json"
HF_INFO = "dataset_info.json"


@dataclass(frozen=True)
class ExportSummary:
    """What one export call did; `record` is export.json as written (or found unchanged)."""

    dest: str
    written: list[int]
    reused: list[int]
    deleted: list[str]
    record: dict[str, Any]

    @property
    def counts(self) -> dict[str, Any]:
        return dict(self.record["counts"])

    def notes(self) -> list[str]:
        """What a trainer's user must know about this export, one line each."""
        fmt, counts = self.record["format"], self.counts
        lines = []
        if fmt in ("specforge", "tokenized"):
            lines.append(EXACT_PATH + ".")
        if fmt == "specforge" and counts.get("no_system_message"):
            lines.append(
                f"warning: {counts['no_system_message']} of {counts['rows_exported']} "
                "conversations have no system message; SpecForge's templates (qwen, "
                "qwen3-thinking, qwen3-instruct) insert 'You are a helpful assistant.' there, "
                "tokens the server never saw"
            )
        if counts.get("input_turns_left_out"):
            lines.append(
                f"generated-only: {counts['input_turns_left_out']} assistant turns that came "
                "with the input were left out (--no-generated-only keeps them)"
            )
        return lines

    def headline(self, fmt: str) -> str:
        """One log line: where it went, what was exported, written and dropped."""
        counts, dropped = self.counts, self.counts["dropped"]
        return (
            f"export {fmt} to {self.dest}: {counts['samples']} samples from "
            f"{counts['rows_exported']} rows; {len(self.written)} shards written, "
            f"{len(self.reused)} unchanged; dropped "
            + (", ".join(f"{k} {v}" for k, v in dropped.items()) or "none")
        )

    def table(self) -> list[dict[str, Any]]:
        """The figures a reader checks first, one per row."""
        counts = self.counts
        return [
            {"figure": "destination", "value": self.dest},
            {"figure": "rows (ok)", "value": counts["rows"]},
            {"figure": "error rows (never exported)", "value": counts["error_rows"]},
            {"figure": "rows exported", "value": counts["rows_exported"]},
            {"figure": "samples", "value": counts["samples"]},
            *({"figure": f"dropped: {k}", "value": v} for k, v in counts["dropped"].items()),
            {"figure": "shards written", "value": len(self.written)},
            {"figure": "shards unchanged", "value": len(self.reused)},
        ]


def export_dataset(
    source: Storage,
    dest: Storage,
    options: ExportOptions,
    *,
    tokenizer_path: Path | str | None = None,
    workers: int | None = None,
    allow_failed: bool = False,
) -> ExportSummary:
    """Write (or bring up to date) the export of `source`'s committed ok rows under `dest`.

    `tokenizer_path` (a model directory or its tokenizer.json) lets the token formats render
    turns that have no stored ids with the model's chat template (regen.lossmask). A dataset
    whose last audit failed is refused unless `allow_failed`; a destination holding another
    format's export is refused (its files would be mixed into the trainer's input)."""
    if source.uri.rstrip("/") == dest.uri.rstrip("/"):
        raise UserError(f"{dest.uri}: the export must not be written into the dataset root")
    if not allow_failed:
        _require_passed_audit(source)
    run = read_run(source)
    fingerprint = run_fingerprint_of(run)
    committed = read_committed(source)  # run.json's view: its run, less dropped ids
    require_dataset(source, committed)
    if not committed.manifests:
        raise UserError(f"{source.uri}: no committed shards to export")
    old_record = _read_json(dest, EXPORT_KEY) or _read_json(dest, LEGACY_EXPORT_KEY)
    if old_record and old_record.get("format") not in (None, options.format):
        raise ConfigError(
            f"{dest.uri}: holds a {old_record['format']} export; write {options.format} to "
            "its own directory (or delete this one first)"
        )
    template = None
    if tokenizer_path is not None and options.format in TOKEN_FORMATS:
        template, why = load_template(Path(tokenizer_path))
        if template is None:
            raise UserError(why)
    enable_thinking = thinking_mode(run) != "off"
    generated_only = _generated_only(options, run)
    manifests = _manifests(committed)
    used = str(template.path) if template is not None else None
    previous = _previous(old_record, options, fingerprint, used)
    present = set(dest.list()) if previous else set()

    todo: list[int] = []
    entries: dict[int, dict[str, Any]] = {}
    for shard, manifest in manifests.items():
        old = previous.get(shard)
        if old and old["manifest"] == manifest and (old["file"] is None or old["file"] in present):
            entries[shard] = old
        else:
            todo.append(shard)

    def part(shard: int) -> ShardExport:
        return shard_export(
            committed.scan([shard]),
            options,
            template,
            enable_thinking=enable_thinking,
            generated_only=generated_only,
        )

    def one(shard: int) -> dict[str, Any]:
        return _write_shard(dest, shard, part(shard), options) | {"manifest": manifests[shard]}

    pool_size = workers or min(4, os.cpu_count() or 1)
    single = f"{options.format}.jsonl" if options.single_file else None
    if single is not None and (todo or set(previous) != set(entries) or single not in present):
        # One file is rewritten whole when anything changed: every shard, in shard order.
        todo = sorted(manifests)
        for shard, entry in _write_single(dest, single, todo, part, pool_size):
            entries[shard] = entry | {"manifest": manifests[shard]}
    elif single is None:
        with ThreadPoolExecutor(max_workers=pool_size) as pool:
            for shard, entry in zip(todo, pool.map(one, todo), strict=True):
                entries[shard] = entry

    shards = [entries[s] for s in sorted(entries)]
    changed = bool(todo) or set(previous) != set(entries)
    if options.format == "hf-dataset":
        _write_hf_index(dest, shards, changed=changed)
    extra = _extra_files(options)
    if options.token_freq and (changed or TOKEN_FREQ not in present):
        dest.write_bytes(TOKEN_FREQ, token_freq_bytes(_token_counts(dest, options, shards)))
    record = _record(source, options, fingerprint, used, shards, generated_only, single)
    if record != old_record:
        dest.write_bytes(EXPORT_KEY, json.dumps(record, indent=2).encode())
    # Only files an earlier export listed are ever deleted: a shard no longer committed, or
    # every file of other options written to this destination before; and the record of an
    # older version, which the trainers' directory loaders would read as data.
    kept = _files(shards) | extra | ({single} if single else set())
    stale = sorted(_files_of(old_record) - kept)
    if dest.exists(LEGACY_EXPORT_KEY):
        stale.append(LEGACY_EXPORT_KEY)
    for key in stale:
        dest.delete(key)
    return ExportSummary(dest.uri, sorted(todo), sorted(set(entries) - set(todo)), stale, record)


def _require_passed_audit(source: Storage) -> None:
    """Refuse a dataset whose last audit (report/audit.json) failed; one never audited passes
    (the run's own export follows its passing audit, and a standalone one is the user's)."""
    report = _read_json(source, AUDIT_REPORT_KEY)
    if report is not None and report.get("verdict") == "fail":
        raise UserError(
            f"{source.uri}: its last audit failed ({AUDIT_REPORT_KEY}); export it anyway with "
            "--allow-failed"
        )


def _generated_only(options: ExportOptions, run: dict[str, Any]) -> bool:
    """The option as given, else on for a `turns: last` dataset (its earlier assistant turns
    came with the input). Only conversation formats carry the input's turns."""
    if options.format in TOKEN_FORMATS:
        return False
    if options.generated_only is not None:
        return options.generated_only
    regeneration = run.get("regeneration")
    turns = regeneration.get("turns") if isinstance(regeneration, dict) else None
    return turns in (None, "last")


def _extra_files(options: ExportOptions) -> set[str]:
    """The files of an export besides its shards."""
    extra = {HF_STATE, HF_INFO} if options.format == "hf-dataset" else set()
    return extra | ({TOKEN_FREQ} if options.token_freq else set())


def _write_single(
    dest: Storage,
    name: str,
    shards: list[int],
    part: Callable[[int], ShardExport],
    pool_size: int,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream every shard's lines, in shard order, into one file: `pool_size` shards are made
    at a time, so memory holds a few shards, never the file. Local: a temp file beside it,
    renamed; S3: the finished temp file uploaded from disk (`Storage.put_file`)."""
    local = dest.root if isinstance(dest, LocalStorage) else None
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=local)
    try:
        with os.fdopen(fd, "wb") as out, ThreadPoolExecutor(max_workers=pool_size) as pool:
            for start in range(0, len(shards), pool_size):
                batch = shards[start : start + pool_size]
                for shard, made in zip(batch, pool.map(part, batch), strict=True):
                    data = _jsonl_bytes(made.frame) if made.frame.height else b""
                    out.write(data)
                    yield shard, _entry(shard, None, len(data), made)
            out.flush()
            os.fsync(out.fileno())
        dest.put_file(name, Path(tmp))
    finally:
        Path(tmp).unlink(missing_ok=True)


def _manifests(committed: Committed) -> dict[int, dict[str, Any]]:
    """What each committed shard's export file is made from: its data key and the view's
    identity of the shard (`Committed.identity`: the data's checksum and the ids the view
    drops from it), so a shard whose view changed, and only that shard, is exported again."""
    return {
        shard: {"data": m.data, "rows": m.rows, "identity": committed.identity(shard)}
        for shard, m in committed.manifests.items()
    }


def _previous(
    old: dict[str, Any] | None,
    options: ExportOptions,
    fingerprint: str | None,
    template: str | None,
) -> dict[int, Any]:
    """Shard entries of an earlier export with the same format, options, dataset run and
    chat template."""
    if not old:
        return {}
    same = (
        old.get("version") == VERSION
        and old.get("options") == options.model_dump()
        and old.get("source", {}).get("fingerprint") == fingerprint
        and old.get("template") == template
    )
    shards = old.get("shards") if same else None
    if not isinstance(shards, list):
        return {}
    return {e["shard"]: e for e in shards if isinstance(e, dict) and "shard" in e}


def _read_json(storage: Storage, key: str) -> dict[str, Any] | None:
    try:
        value = json.loads(storage.read_bytes(key))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{storage.uri}/{key}: not valid JSON: {err}") from None
    return value if isinstance(value, dict) else None


def _files(entries: Any) -> set[str]:
    return {e["file"] for e in entries if e.get("file")}


def _files_of(record: dict[str, Any] | None) -> set[str]:
    """Every file an export.json accounts for, its hf-dataset index included."""
    if not record or not isinstance(record.get("shards"), list):
        return set()
    index = {HF_STATE, HF_INFO} if record.get("format") == "hf-dataset" else set()
    if record.get("options", {}).get("token_freq"):
        index.add(TOKEN_FREQ)
    if isinstance(record.get("single_file"), str):
        index.add(record["single_file"])
    return _files(e for e in record["shards"] if isinstance(e, dict)) | index


def _write_shard(
    dest: Storage, shard: int, part: ShardExport, options: ExportOptions
) -> dict[str, Any]:
    if options.format == "hf-dataset":
        key: str | None = f"shard-{shard:06d}.arrow"
        data = _arrow_bytes(part.frame)
    elif part.frame.height:
        key = f"shard-{shard:06d}.jsonl"
        data = _jsonl_bytes(part.frame)
    else:
        # No empty JSONL files: a JSON reader given only empty files has no columns at all.
        key, data = None, b""
    if key is not None:
        dest.write_bytes(key, data)
    return _entry(shard, key, len(data), part)


def _entry(shard: int, key: str | None, size: int, part: ShardExport) -> dict[str, Any]:
    return {
        "shard": shard,
        "file": key,
        "size": size,
        "rows": part.rows,
        "error_rows": part.error_rows,
        "rows_exported": part.rows_exported,
        "samples": part.samples,
        "no_system_message": part.no_system,
        "input_turns_left_out": part.input_turns,
        "dropped": dict(sorted(part.dropped.items())),
    }


def _jsonl_bytes(frame: pl.DataFrame) -> bytes:
    if frame.columns == ["line"]:
        return (frame.get_column("line").str.join("\n").item() + "\n").encode()
    buffer = io.BytesIO()
    frame.write_ndjson(buffer)
    return buffer.getvalue()


def _arrow_bytes(frame: pl.DataFrame) -> bytes:
    """The shard as the Arrow file `Dataset.save_to_disk` writes, byte for byte: datasets' own
    `ArrowWriter`, without save_to_disk's per-call cost (~100 ms a shard, 40x the write)."""
    datasets = _datasets()
    import pyarrow as pa  # type: ignore[import-untyped]
    from datasets.arrow_writer import ArrowWriter  # type: ignore[import-untyped]

    table = frame.to_arrow()
    stream = pa.BufferOutputStream()
    writer = ArrowWriter(features=datasets.Features.from_arrow_schema(table.schema), stream=stream)
    writer.write_table(table)
    writer.finalize()
    return bytes(stream.getvalue().to_pybytes())


def _datasets() -> Any:
    """Hugging Face datasets, imported only for hf-dataset: an optional extra that the
    rehearsal never needs."""
    try:
        import datasets  # type: ignore[import-untyped]
    except ImportError:
        from regen.machine.extras import install_command

        raise UserError(
            "format hf-dataset needs Hugging Face datasets: "
            + install_command("export", "datasets")
        ) from None
    datasets.disable_progress_bars()
    return datasets


def _save_to_disk(frame: pl.DataFrame) -> dict[str, bytes]:
    """The files `Dataset.save_to_disk` writes for `frame`, by name."""
    datasets = _datasets()
    with tempfile.TemporaryDirectory(prefix="regen-export-") as tmp:
        datasets.Dataset.from_polars(frame).save_to_disk(tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}


def _write_hf_index(dest: Storage, shards: list[dict[str, Any]], *, changed: bool) -> None:
    """`state.json` and `dataset_info.json` over every shard's Arrow file, so
    `datasets.load_from_disk(dest)` opens the whole export as one dataset.

    Written by `save_to_disk` itself for an empty frame of the same columns; only the file list
    changes (and the fingerprint, which keys the caches of a consumer's `.map`). The format
    is torch, as speculators' own `prepare_data` saves it (`set_format("torch")`): its
    training loader (`ArrowDataset.__getitem__`) compares `input_ids` with `torch.equal` and
    `save_token_frequency_distribution` calls `loss_mask.to(...)`, which a numpy array lacks.
    A reader without torch opens it with `.with_format(None)`.
    """
    files = [e["file"] for e in shards]
    state = _read_json(dest, HF_STATE)
    listed = [f.get("filename") for f in state.get("_data_files", [])] if state else None
    if not changed and listed == files and dest.exists(HF_INFO):
        return
    empty = pl.DataFrame(
        schema={
            "id": pl.String,
            "input_ids": pl.List(pl.Int32),
            "loss_mask": pl.List(pl.Int8),
            "seq_len": pl.Int64,
        }
    )
    saved = _save_to_disk(empty)
    template = json.loads(saved[HF_STATE])
    fingerprint = hashlib.sha256(json.dumps(shards).encode()).hexdigest()[:16]
    template.update(
        _data_files=[{"filename": f} for f in files],
        _fingerprint=fingerprint,
        _format_type="torch",
    )
    dest.write_bytes(HF_INFO, saved[HF_INFO])
    dest.write_bytes(HF_STATE, json.dumps(template, indent=2).encode())


def _record(
    source: Storage,
    options: ExportOptions,
    fingerprint: str | None,
    template: str | None,
    shards: list[dict[str, Any]],
    generated_only: bool,
    single_file: str | None,
) -> dict[str, Any]:
    dropped: Counter[str] = Counter()
    for entry in shards:
        dropped.update(entry["dropped"])
    total = {k: sum(e[k] for e in shards) for k in ("rows", "error_rows", "rows_exported")}
    return {
        "version": VERSION,
        "format": options.format,
        "options": options.model_dump(),
        "source": {"uri": source.uri, "fingerprint": fingerprint},
        # The chat template that gave the samples of turns without stored ids (None: none).
        "template": template,
        # The input's assistant turns left out of conversations (the option, resolved).
        "generated_only": generated_only,
        "single_file": single_file,
        "counts": {
            "shards": len(shards),
            **total,
            "samples": sum(e["samples"] for e in shards),
            "no_system_message": sum(e.get("no_system_message", 0) for e in shards),
            "input_turns_left_out": sum(e.get("input_turns_left_out", 0) for e in shards),
            "dropped": dict(sorted(dropped.items())),
        },
        "files": [single_file] if single_file else [e["file"] for e in shards if e["file"]],
        "shards": shards,
    }


def _token_counts(
    dest: Storage, options: ExportOptions, shards: list[dict[str, Any]]
) -> Counter[int]:
    """How often each token id is trained (loss mask 1) across the export's files, read back
    from them: the stored response ids as exported, after every filter. A file's lists are
    flattened to one array each (a sample's ids and mask have one length) and counted with
    bincount, which keeps this pass a few times cheaper than the export itself."""
    files = [e["file"] for e in shards if e.get("file")]
    total = np.zeros(0, dtype=np.int64)
    for key in files:
        data = dest.read_bytes(key)
        if options.format == "hf-dataset":
            import pyarrow as pa

            table = pa.ipc.open_stream(data).read_all()
            ids = table.column("input_ids").combine_chunks().flatten().to_numpy()
            mask = table.column("loss_mask").combine_chunks().flatten().to_numpy()
        else:
            frame = pl.read_ndjson(io.BytesIO(data), schema=_TOKEN_SCHEMA)
            ids = frame.get_column("input_ids").explode().to_numpy()
            mask = frame.get_column("loss_mask").explode().to_numpy()
        counts = np.bincount(ids[mask == 1])
        if len(counts) > len(total):
            counts[: len(total)] += total
            total = counts
        else:
            total[: len(counts)] += counts
    return Counter({int(i): int(total[i]) for i in np.flatnonzero(total)})


_TOKEN_SCHEMA = {"input_ids": pl.List(pl.Int64), "loss_mask": pl.List(pl.Int8)}


# torch's serialization before its zip format (torch.serialization._legacy_save), which
# torch.load still reads, weights_only included: a plain dict needs no torch to write.
_TORCH_MAGIC = 0x1950A86A20F9469CFC6C
_TORCH_PROTOCOL = 1001


def token_freq_bytes(counts: Counter[int]) -> bytes:
    """speculators' token_freq.pt: `{token_id: count}` of trained tokens, as
    `save_token_frequency_distribution` saves it with torch.save."""
    buffer = io.BytesIO()
    sys_info = {
        "protocol_version": _TORCH_PROTOCOL,
        "little_endian": True,
        "type_sizes": {"short": 2, "int": 4, "long": 4},
    }
    records: tuple[Any, ...] = (_TORCH_MAGIC, _TORCH_PROTOCOL, sys_info, dict(counts), [])
    for obj in records:
        pickle.dump(obj, buffer, protocol=2)
    return buffer.getvalue()
