"""JSONL rows read some batch of bytes at a time and decoded by polars.

Each batch is read as one polars String column per line (a CSV read with a NUL separator and
no quoting: a raw NUL byte cannot occur in JSON text, and `facts.file_facts` refuses a file that
has one), then decoded with `str.json_decode`. polars refuses a whole batch when one line is
bad, so a failing batch is bisected down to the bad lines; only those lines (a handful, not the
file) are looked at one by one in Python, to say precisely what is wrong with them.

polars' decoder quietly turns JSON numbers and booleans into strings where a string is
expected; a regex over the raw line finds such scalars under a known key. It matches only an
unescaped `"key":` that follows `{` or `,`, which inside JSON text can only be a real key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from regen.errors import UserError
from regen.prompts.formats import ANY_TURN, AS_NAMED, Columns, split_conversations
from regen.prompts.tool_rows import normalize_tool_lines
from regen.schema import MESSAGE

_RECORD = pl.Struct(
    {
        "id": pl.String,
        "messages": pl.List(MESSAGE),
        "conversations": pl.List(ANY_TURN),
        "prompt": pl.String,
        "system": pl.String,
        "tools": pl.String,
    }
)
_TEXT_SCALAR = r'[{,]\s*"(content|role|from|value|prompt|system)"\s*:\s*(?:-?[0-9]|true|false)'
_BAD_ID = r'[{,]\s*"id"\s*:\s*(?:true|false|-?[0-9]+[.eE])'
_DECODE_BATCH = 65_536
_JSON_TYPES = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def batches(
    path: Path,
    name: str,
    utf8: bool,
    n_rows: int | None,
    batch_bytes: int,
    columns: Columns = AS_NAMED,
) -> Iterator[pl.DataFrame]:
    """The file's lines read some `batch_bytes` at a time, cut at a line end (a cut never
    splits a UTF-8 character), numbered on from the batch before; only the first `n_rows`."""
    offset, left, rest = 0, n_rows, b""
    with path.open("rb") as fh:
        while left is None or left > 0:
            chunk = fh.read(batch_bytes)
            if not chunk and not rest:
                return
            data = rest + chunk
            # At the end of the file the last line may have no line end of its own.
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            if cut == 0:  # no line end yet: one line longer than a batch
                rest = data
                continue
            data, rest = data[:cut], data[cut:]
            fields = _jsonl_fields(data, name, utf8, left, offset, columns)
            if fields.height:
                yield fields
            read = data.count(b"\n") + (not data.endswith(b"\n"))
            offset += read
            left = None if left is None else left - read


def _record(columns: Columns) -> pl.Struct:
    """The fields a line is decoded into, under the file's own names for the renamed ones;
    the fields they stand in for are not decoded at all."""
    if not columns.renames():
        return _RECORD
    by_target = {target: source for source, target in columns.renames().items()}
    aside = columns.set_aside()
    return pl.Struct(
        {
            by_target.get(key, key): dtype
            for key, dtype in _RECORD.to_schema().items()
            if key in by_target or key not in aside
        }
    )


def _field(record: pl.Struct, columns: Columns, key: str) -> pl.Expr:
    """The decoded field the readers know as `key` (null when it was set aside)."""
    by_target = {target: source for source, target in columns.renames().items()}
    source = by_target.get(key, key)
    if source not in record.to_schema():
        return pl.lit(None, dtype=_RECORD.to_schema()[key])
    return pl.col("rec").struct.field(source)


def window_batches(
    path: Path, name: str, utf8: bool, windows: list[tuple[int, int]], columns: Columns = AS_NAMED
) -> Iterator[pl.DataFrame]:
    """The lines of each (start, length) window (0-based, in order, not overlapping), numbered
    as in the file: one pass that keeps only those lines."""
    picked: list[list[bytes]] = [[] for _ in windows]
    end = windows[-1][0] + windows[-1][1] if windows else 0
    with path.open("rb") as fh:
        for i, line in enumerate(fh):
            if i >= end:
                break
            for w, (start, length) in enumerate(windows):
                if start <= i < start + length:
                    picked[w].append(line)
    for (start, _), lines in zip(windows, picked, strict=True):
        fields = _jsonl_fields(b"".join(lines), name, utf8, None, start, columns) if lines else None
        if fields is not None and fields.height:
            yield fields


def _jsonl_fields(
    data: bytes, name: str, utf8: bool, n_rows: int | None, offset: int, columns: Columns
) -> pl.DataFrame:
    """Columns line, given_id, messages, conversations, prompt, system, reason (read-level)."""
    lines = pl.read_csv(
        data,
        has_header=False,
        separator="\x00",
        quote_char=None,
        comment_prefix=None,
        schema={"raw": pl.String},
        encoding="utf8" if utf8 else "utf8-lossy",
        n_rows=n_rows,
        row_index_name="line",
        row_index_offset=offset + 1,
    )
    lines = lines.with_columns(pl.col("line").cast(pl.Int64)).filter(
        pl.col("raw").str.strip_chars().str.len_bytes() > 0
    )
    raw = lines.get_column("raw")
    if offset == 0 and len(raw) and raw[0].lstrip().startswith("["):
        # A JSON array file: its lines may happen to parse, but the rows are not JSONL rows.
        raise UserError(f"{name}: line {lines['line'][0]}: {_explain(raw[0])[0]}")
    # Rows with tools carry arbitrary JSON (schemas, arguments as objects) that no struct
    # decodes: those lines alone are rewritten to text first (regen.prompts.tool_rows).
    raw, tool_reasons, tool_ids = normalize_tool_lines(raw)
    lines = lines.with_columns(raw)
    record_type = _record(columns)
    decoded, bad = _decode_bisecting(raw, record_type)
    read_reason = tool_reasons.alias("read_reason")
    read_id = tool_ids.alias("read_id")
    if bad:
        explained = [_explain(raw[i]) for i in bad]
        read_reason = read_reason.scatter(bad, [reason for reason, _ in explained])
        read_id = read_id.scatter(bad, [row_id for _, row_id in explained])
    frame = lines.with_columns(rec=decoded, read_reason=read_reason, read_id=read_id)
    scalar = pl.col("raw").str.extract(_TEXT_SCALAR, 1)
    reason = (
        pl.when(pl.col("read_reason").is_not_null())
        .then(pl.col("read_reason"))
        .when(pl.lit(not utf8) & pl.col("raw").str.contains("\ufffd", literal=True))
        .then(pl.lit("not valid UTF-8"))
        .when(scalar.is_not_null())
        .then(pl.format("{} must be a string", scalar))
        .when(pl.col("raw").str.contains(_BAD_ID))
        .then(pl.lit("id must be a string or an integer"))
    )

    def field(key: str) -> pl.Expr:
        return _field(record_type, columns, key).alias(key)

    return frame.select(
        "line",
        pl.coalesce(field("id"), "read_id").alias("given_id"),
        *split_conversations(field("messages"), field("conversations")),
        field("prompt"),
        field("system"),
        field("tools"),
        reason.alias("reason"),
    )


def _decode_bisecting(raw: pl.Series, record: pl.Struct = _RECORD) -> tuple[pl.Series, list[int]]:
    """Decode every line; a line polars cannot decode becomes null and its index is returned."""
    pieces: list[pl.Series] = []
    bad: list[int] = []

    def decode(start: int, length: int) -> None:
        part = raw.slice(start, length)
        try:
            pieces.append(part.str.json_decode(record))
        except pl.exceptions.PolarsError:
            if length == 1:
                bad.append(start)
                pieces.append(pl.Series([None], dtype=record))
                return
            half = length // 2
            decode(start, half)
            decode(start + half, length - half)

    for start in range(0, len(raw), _DECODE_BATCH):
        decode(start, min(_DECODE_BATCH, len(raw) - start))
    if not pieces:
        return pl.Series("rec", [], dtype=record), bad
    return pl.concat(pieces).alias("rec"), bad


def _explain(line: str) -> tuple[str, str | None]:
    """Why polars could not decode one line, in the user's terms, and its id if it has one."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        stripped = line.lstrip()
        if stripped.startswith("["):
            return "not valid JSON (a JSON array? use one object per line)", None
        if stripped.endswith(("{", "[", ",")):
            return "not valid JSON (a pretty-printed file? use one object per line)", None
        return "not valid JSON", None
    if isinstance(value, list):
        return "a JSON array, not an object (use one object per line)", None
    if not isinstance(value, dict):
        return f"a JSON {_JSON_TYPES.get(type(value), 'value')}, not an object", None
    row_id = value.get("id")
    given = str(row_id) if isinstance(row_id, str | int) and not isinstance(row_id, bool) else None
    return _explain_object(value), given


def _explain_object(row: dict[str, Any]) -> str:
    for key in ("prompt", "system"):
        if key in row and row[key] is not None and not isinstance(row[key], str):
            return f"{key} must be a string"
    if isinstance(row.get("id"), bool) or not isinstance(row.get("id"), str | int | None):
        return "id must be a string or an integer"
    messages = row.get("messages")
    if messages is not None and not isinstance(messages, list):
        return "messages must be a list of {role, content} objects"
    turns = row.get("conversations")
    if turns is not None and not isinstance(turns, list):
        return "conversations must be a list of {from, value} or {role, content} objects"
    for i, turn in enumerate(turns or []):
        if not isinstance(turn, dict):
            return f"message {i}: not a {{from, value}} or {{role, content}} object"
        if isinstance(turn.get("content"), list):
            return f"message {i}: content must be a string (content parts are not supported)"
        for key in ("from", "value", "role", "content"):
            if turn.get(key) is not None and not isinstance(turn[key], str):
                return f"message {i}: {key} must be a string"
    for i, message in enumerate(messages or []):
        if not isinstance(message, dict):
            return f"message {i}: not a {{role, content}} object"
        content = message.get("content")
        if isinstance(content, list):
            return f"message {i}: content must be a string (content parts are not supported)"
        if content is not None and not isinstance(content, str):
            return f"message {i}: content must be a string"
        if not isinstance(message.get("role"), str | None):
            return f"message {i}: role must be a string"
    return "cannot be read as a prompt row"
