"""Read the prompt set (JSONL or Parquet) into validated chat rows, with every unusable row
set aside with its line number and reason, so one bad line never stops a million-row run.

Three row formats, and each row describes itself: OpenAI `messages`, `prompt` (+ `system`), and
ShareGPT `conversations` ({from: human/gpt/system, value}, + `system`), which is normalised to
messages. One file may hold rows of all three; each row is read by its own format, and only a
row whose own format is missing or ambiguous (the keys of two formats) is rejected. The layouts
training sets come in are read as they are: `conversations` of {role, content} turns
(SpecForge's prepare_data) are messages rows, and UltraChat's `prompt` beside `messages` is its
first user message again.

A file is validated some `_BATCH_BYTES` at a time (JSONL cut at line ends, Parquet in row
slices), so a million-row file never has all its working columns in memory at once; only line,
id, reason, format and the usable rows' messages are kept, and duplicate ids are found across
the whole file at the end. Each JSONL batch is read as one polars String column per line (a CSV
read with a NUL separator and no quoting: a raw NUL byte cannot occur in JSON text, so a file
that has one is refused as binary), then decoded with `str.json_decode` in batches. polars
refuses a whole batch when one line is bad, so a failing batch is bisected down to the bad
lines; only those lines (a handful, not the file) are looked at one by one in Python, to say
precisely what is wrong with them.

polars' decoder quietly turns JSON numbers and booleans into strings where a string is
expected; a regex over the raw line finds such scalars under a known key. It matches only an
unescaped `"key":` that follows `{` or `,`, which inside JSON text can only be a real key.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from regen.dataset.keys import REJECTS_KEY
from regen.errors import UserError
from regen.schema import MESSAGE
from regen.storage import Storage, open_storage

ROLES = ("system", "user", "assistant")
# ShareGPT speaker names and the chat roles they stand for: ShareGPT dumps name the assistant
# chatgpt, bing or bard in places, and some converters write user/assistant.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}
# Format name -> the key (column) that carries it.
FORMAT_KEYS = {"messages": "messages", "prompt": "prompt", "sharegpt": "conversations"}

# A `conversations` turn as read: ShareGPT's {from, value}, or {role, content} as SpecForge's
# prepare_data writes it (those rows are OpenAI messages under another key).
_ANY_TURN = pl.Struct(
    {"from": pl.String, "value": pl.String, "role": pl.String, "content": pl.String}
)
_RECORD = pl.Struct(
    {
        "id": pl.String,
        "messages": pl.List(MESSAGE),
        "conversations": pl.List(_ANY_TURN),
        "prompt": pl.String,
        "system": pl.String,
    }
)
_TEXT_SCALAR = r'[{,]\s*"(content|role|from|value|prompt|system)"\s*:\s*(?:-?[0-9]|true|false)'
_BAD_ID = r'[{,]\s*"id"\s*:\s*(?:true|false|-?[0-9]+[.eE])'
_DECODE_BATCH = 65_536
# Validation works on this much of the file at a time: its working columns take some ten times
# the batch, and freed batches' pages stay with the allocator, so smaller batches keep the peak
# down (8 MiB: 632 MB at a million prompts, 2 MiB: 550 MB) at no cost in speed.
_BATCH_BYTES = 2 << 20
_FORMAT = pl.Enum(list(FORMAT_KEYS))
_HASH_CHUNK = 1 << 20
_PARQUET_MAGIC = b"PAR1"

_JSON_TYPES = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}

REJECTS_SCHEMA = pl.Schema({"line": pl.Int64, "id": pl.String, "reason": pl.String})


MIXED = "mixed"


def format_name(formats: dict[str, int]) -> str:
    """The one format of a file's valid rows, or `mixed` when they use several."""
    return next(iter(formats)) if len(formats) == 1 else MIXED


def format_counts(formats: dict[str, int]) -> str:
    """`messages 600, prompt 400`: the per-format figure a user sees."""
    return ", ".join(f"{fmt} {count}" for fmt, count in formats.items())


@dataclass(frozen=True)
class PromptSet:
    """Validated rows (`id`, `line`, `messages`) and the rejected ones (`line`, `id`, `reason`).

    `line` is the 1-based line of a JSONL file or the 1-based row of a Parquet file.
    `fingerprint` is the sha256 of the file's bytes: any edit of the input changes it.
    `formats` counts the valid rows of each format present, in `FORMAT_KEYS` order.
    """

    path: str
    formats: dict[str, int]
    fingerprint: str
    valid: pl.DataFrame
    rejects: pl.DataFrame

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

    @property
    def format(self) -> str:
        return format_name(self.formats)


@dataclass(frozen=True)
class _FileFacts:
    fingerprint: str
    size: int
    is_parquet: bool
    utf8: bool
    nul_line: int | None


def load_prompts(path_or_uri: str, *, max_prompt_bytes: int = 1_000_000) -> PromptSet:
    """Load a local path or an `s3://bucket/key` URL (downloaded to a temp file first)."""
    if "://" not in path_or_uri:
        return load_prompts_file(Path(path_or_uri), max_prompt_bytes=max_prompt_bytes)
    with tempfile.TemporaryDirectory(prefix="regen-prompts-") as tmp:
        local = _download(path_or_uri, Path(tmp))
        return load_prompts_file(local, max_prompt_bytes=max_prompt_bytes, name=path_or_uri)


def load_prompts_file(
    path: Path, *, max_prompt_bytes: int = 1_000_000, name: str | None = None
) -> PromptSet:
    """Validate a local file; `name` is how messages name it (default: the path)."""
    name = name or str(path)
    facts = _inspect(path, name)
    formats, valid, rejects = _load(path, name, facts, max_prompt_bytes, n_rows=None)
    return PromptSet(name, formats, facts.fingerprint, valid, rejects)


def preview(path_or_uri: str, n: int = 1000, *, max_prompt_bytes: int = 1_000_000) -> PromptPreview:
    """Validate only the first `n` rows: cheap enough to run before any GPU is rented."""
    if "://" in path_or_uri:
        with tempfile.TemporaryDirectory(prefix="regen-prompts-") as tmp:
            local = _download(path_or_uri, Path(tmp))
            return _preview(local, path_or_uri, n, max_prompt_bytes)
    return _preview(Path(path_or_uri), path_or_uri, n, max_prompt_bytes)


def write_rejects(storage: Storage, prompt_set: PromptSet) -> None:
    """Always written, even empty, so the audit can tell "no rejects" from "not recorded"."""
    storage.write_bytes(REJECTS_KEY, _parquet_bytes(prompt_set.rejects))


def _preview(path: Path, name: str, n: int, max_prompt_bytes: int) -> PromptPreview:
    facts = _inspect(path, name, fingerprint=False)
    formats, valid, rejects = _load(path, name, facts, max_prompt_bytes, n_rows=n)
    first = rejects.sort("line").row(0, named=True)["reason"] if rejects.height else None
    return PromptPreview(
        name, formats, valid.height + rejects.height, valid.height, rejects.height, first
    )


def _download(uri: str, tmp: Path) -> Path:
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


def _parquet_bytes(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd")
    return buf.getvalue()


def _inspect(path: Path, name: str, *, fingerprint: bool = True) -> _FileFacts:
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
    return _FileFacts(digest.hexdigest(), size, is_parquet, utf8, nul_line)


def _load(
    path: Path, name: str, facts: _FileFacts, max_prompt_bytes: int, n_rows: int | None
) -> tuple[dict[str, int], pl.DataFrame, pl.DataFrame]:
    """Validate batch by batch: only one batch's working columns are held at a time; of the
    rows checked only the usable ones (id, line, format, messages) and the rejects are kept."""
    if facts.is_parquet:
        batches = _parquet_batches(path, name, facts.size, n_rows)
    elif path.suffix.lower() == ".parquet":
        raise UserError(f"{name}: not a Parquet file (no PAR1 magic bytes)")
    else:
        batches = _jsonl_batches(path, name, facts.utf8, n_rows)
    valid_parts, reject_parts = [], []
    for fields in batches:
        valid, rejects = _checked_batch(fields, max_prompt_bytes)
        valid_parts.append(valid)
        reject_parts.append(rejects)
    if not valid_parts:
        raise UserError(f"{name}: no prompts (only blank lines)")
    valid, duplicates = _split_duplicates(pl.concat(valid_parts))
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
    return formats, valid.select("id", "line", "messages"), rejects


def _checked_batch(
    fields: pl.DataFrame, max_prompt_bytes: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A batch's usable rows (id, line, row_format, messages) and its rejects."""
    checked = _check_rows(fields.with_columns(row_format=_row_format()), max_prompt_bytes)
    ok = pl.col("reason").is_null()
    valid = checked.filter(ok).select("id", "line", pl.col("row_format").cast(_FORMAT), "messages")
    return valid, checked.filter(~ok).select("line", "id", "reason").cast(REJECTS_SCHEMA)


def _split_duplicates(valid: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A usable row whose id an earlier usable row has is rejected, naming that row's line.
    Only a file with duplicates pays for a second copy of the usable rows."""
    marked = valid.select("line", "id", pl.col("line").min().over("id").alias("first"))
    duplicate = marked.get_column("line") != marked.get_column("first")
    if not duplicate.any():
        return valid, pl.DataFrame(schema=REJECTS_SCHEMA)
    rejects = marked.filter(duplicate).select(
        "line", "id", pl.format("duplicate id (first on line {})", "first").alias("reason")
    )
    return valid.filter(~duplicate), rejects


# --- JSONL -------------------------------------------------------------------------------------


def _jsonl_batches(path: Path, name: str, utf8: bool, n_rows: int | None) -> Iterator[pl.DataFrame]:
    """The file's lines read some `_BATCH_BYTES` at a time, cut at a line end (a cut never
    splits a UTF-8 character), numbered on from the batch before; only the first `n_rows`."""
    offset, left, rest = 0, n_rows, b""
    with path.open("rb") as fh:
        while left is None or left > 0:
            chunk = fh.read(_BATCH_BYTES)
            if not chunk and not rest:
                return
            data = rest + chunk
            # At the end of the file the last line may have no line end of its own.
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            if cut == 0:  # no line end yet: one line longer than a batch
                rest = data
                continue
            data, rest = data[:cut], data[cut:]
            fields = _jsonl_fields(data, name, utf8, left, offset)
            if fields.height:
                yield fields
            read = data.count(b"\n") + (not data.endswith(b"\n"))
            offset += read
            left = None if left is None else left - read


def _jsonl_fields(
    data: bytes, name: str, utf8: bool, n_rows: int | None, offset: int
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
    decoded, bad = _decode_bisecting(raw)
    read_reason = pl.repeat(None, len(raw), dtype=pl.String, eager=True).alias("read_reason")
    read_id = read_reason.alias("read_id")
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
    record = pl.col("rec").struct
    return frame.select(
        "line",
        pl.coalesce(record.field("id"), "read_id").alias("given_id"),
        *_split_conversations(record.field("messages"), record.field("conversations")),
        record.field("prompt"),
        pl.col("rec").struct.field("system"),
        reason.alias("reason"),
    )


def _split_conversations(messages: pl.Expr, turns: pl.Expr) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(messages, conversations, turns_as_roles): `conversations` of {role, content} turns
    become `messages` (unless the row has those too); ShareGPT turns stay `conversations` as
    {from, value}. An empty list is left as `conversations`, which says it is empty."""
    turn = pl.element().struct
    as_roles = (
        messages.is_null()
        & turns.list.eval(turn.field("role").is_not_null()).list.any()
        & ~turns.list.eval(
            turn.field("from").is_not_null() | turn.field("value").is_not_null()
        ).list.any()
    )
    chat = turns.list.eval(pl.struct(turn.field("role"), turn.field("content")))
    sharegpt = turns.list.eval(pl.struct(turn.field("from"), turn.field("value")))
    return (
        pl.when(as_roles).then(chat).otherwise(messages).alias("messages"),
        pl.when(as_roles).then(None).otherwise(sharegpt).alias("conversations"),
        as_roles.fill_null(False).alias("turns_as_roles"),
    )


def _decode_bisecting(raw: pl.Series) -> tuple[pl.Series, list[int]]:
    """Decode every line; a line polars cannot decode becomes null and its index is returned."""
    pieces: list[pl.Series] = []
    bad: list[int] = []

    def decode(start: int, length: int) -> None:
        part = raw.slice(start, length)
        try:
            pieces.append(part.str.json_decode(_RECORD))
        except pl.exceptions.PolarsError:
            if length == 1:
                bad.append(start)
                pieces.append(pl.Series([None], dtype=_RECORD))
                return
            half = length // 2
            decode(start, half)
            decode(start + half, length - half)

    for start in range(0, len(raw), _DECODE_BATCH):
        decode(start, min(_DECODE_BATCH, len(raw) - start))
    if not pieces:
        return pl.Series("rec", [], dtype=_RECORD), bad
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


# --- Parquet -----------------------------------------------------------------------------------


def _parquet_batches(
    path: Path, name: str, size: int, n_rows: int | None
) -> Iterator[pl.DataFrame]:
    """The rows in slices of some `_BATCH_BYTES` of the file each, numbered from 1."""
    try:
        scan = pl.scan_parquet(path, n_rows=n_rows)
        schema = scan.collect_schema()
        total = scan.select(pl.len()).collect().item()
    except pl.exceptions.PolarsError as err:
        raise UserError(f"{name}: not a readable Parquet file: {_first_line(err)}") from None
    columns = [_parquet_id(schema, name)]
    messages, conversations = schema.get("messages"), schema.get("conversations")
    if messages is not None:
        columns.append(_parquet_messages(messages, name))
    else:
        columns.append(pl.lit(None, dtype=pl.List(MESSAGE)).alias("messages"))
    if conversations is not None:
        columns.append(_parquet_turns(conversations, name))
    else:
        columns.append(pl.lit(None, dtype=pl.List(_ANY_TURN)).alias("conversations"))
    for key in ("prompt", "system"):
        if key not in schema:
            columns.append(pl.lit(None, dtype=pl.String).alias(key))
        elif schema[key] in (pl.String, pl.Null):
            columns.append(pl.col(key).cast(pl.String))
        else:
            raise UserError(f"{name}: column {key} has type {schema[key]}, expected a string")
    if not any(key in schema for key in FORMAT_KEYS.values()):
        raise UserError(f"{name}: has no messages, conversations or prompt column")
    columns.append(pl.lit(None, dtype=pl.String).alias("reason"))
    # Each row's turns by their own layout, as a JSONL line's are.
    split = _split_conversations(pl.col("messages"), pl.col("conversations"))
    step = max(1, total * _BATCH_BYTES // size)
    for start in range(0, total, step):
        line = pl.int_range(start + 1, start + 1 + pl.len(), dtype=pl.Int64).alias("line")
        try:
            batch = scan.slice(start, step).select(line, *columns).with_columns(*split).collect()
        except pl.exceptions.PolarsError as err:
            raise UserError(f"{name}: cannot read Parquet data: {_first_line(err)}") from None
        yield batch


def _parquet_id(schema: pl.Schema, name: str) -> pl.Expr:
    if "id" not in schema:
        return pl.lit(None, dtype=pl.String).alias("given_id")
    dtype = schema["id"]
    if dtype in (pl.String, pl.Null) or dtype.is_integer():
        return pl.col("id").cast(pl.String).alias("given_id")
    raise UserError(f"{name}: column id has type {dtype}, expected a string or an integer")


def _struct_fields(dtype: pl.DataType) -> dict[str, pl.DataType]:
    inner = getattr(dtype, "inner", None)
    return {f.name: f.dtype for f in getattr(inner, "fields", [])}


def _parquet_messages(dtype: pl.DataType, name: str) -> pl.Expr:
    return _parquet_chat(dtype, name, "messages", ("role", "content")).alias("messages")


def _parquet_turns(dtype: pl.DataType, name: str) -> pl.Expr:
    """A conversations column as {from, value, role, content} turns, whichever of them it has:
    ShareGPT's layout, SpecForge's, or both where rows of the two share one column."""
    keys = ("from", "value", "role", "content")
    fields = _struct_fields(dtype)
    if (
        not isinstance(dtype, pl.List)
        or not any(fields.get(who) == pl.String for who in ("from", "role"))
        or any(fields.get(key, pl.Null) not in (pl.String, pl.Null) for key in keys)
    ):
        raise UserError(
            f"{name}: column conversations has type {dtype}, "
            "expected a list of {from, value} or {role, content}"
        )
    turn = pl.element().struct
    return pl.col("conversations").list.eval(
        pl.struct(
            turn.field(key).cast(pl.String) if key in fields else pl.lit(None, pl.String).alias(key)
            for key in keys
        )
    )


def _parquet_chat(dtype: pl.DataType, name: str, column: str, keys: tuple[str, str]) -> pl.Expr:
    """A list-of-struct chat column, its text cast to String (an all-null one reads as Null)."""
    who, text = keys
    fields = _struct_fields(dtype)
    if (
        not isinstance(dtype, pl.List)
        or fields.get(who) != pl.String
        or fields.get(text) not in (pl.String, pl.Null)
    ):
        raise UserError(
            f"{name}: column {column} has type {dtype}, expected a list of {{{who}, {text}}}"
        )
    return pl.col(column).list.eval(
        pl.struct(
            pl.element().struct.field(who),
            pl.element().struct.field(text).cast(pl.String),
        )
    )


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


# --- row checks, shared by both formats --------------------------------------------------------


def _row_format() -> pl.Expr:
    """A row's own format, or null where it has none to tell: unreadable, no format key, an
    empty list, or the keys of two formats (UltraChat's `prompt` repeating the first user
    message beside `messages` is a messages row)."""
    has = {key: pl.col(key).is_not_null() for key in FORMAT_KEYS.values()}
    message = pl.element().struct
    first_user = (
        pl.col("messages")
        .list.eval(message.field("content").filter(message.field("role") == "user"))
        .list.first()
    )
    repeats_first_user = (pl.col("prompt") == first_user).fill_null(False)
    return (
        pl.when(pl.col("reason").is_not_null())
        .then(pl.lit(None, dtype=pl.String))
        .when(has["messages"] & ~has["conversations"] & (~has["prompt"] | repeats_first_user))
        .then(pl.lit("messages"))
        .when(
            has["conversations"]
            & ~has["messages"]
            & ~has["prompt"]
            & (pl.col("conversations").list.len() > 0)
        )
        .then(pl.lit("sharegpt"))
        .when(has["prompt"] & ~has["messages"] & ~has["conversations"])
        .then(pl.lit("prompt"))
    )


def _check_rows(fields: pl.DataFrame, max_prompt_bytes: int) -> pl.DataFrame:
    """Adds the normalised `messages`, the final `id` and the first failing `reason` per row;
    each row is checked and normalised by its own `row_format`. Duplicate ids span batches:
    `_split_duplicates` finds them once every batch is checked."""
    msgs = pl.col("messages")
    role = pl.element().struct.field("role")
    content = pl.element().struct.field("content")
    bad_role_at = msgs.list.eval(role.is_null() | role.is_in(ROLES).not_()).list.arg_max()
    null_content_at = msgs.list.eval(content.is_null()).list.arg_max()
    # ShareGPT speakers are checked as given, so the reason names the user's `from` value.
    turns = pl.col("conversations")
    speaker = pl.element().struct.field("from")
    bad_from = speaker.is_null() | speaker.is_in(list(SHAREGPT_ROLES)).not_()
    bad_from_at = turns.list.eval(bad_from).list.arg_max()
    row_format = pl.col("row_format")
    sharegpt = row_format == "sharegpt"
    text_key = pl.when(sharegpt).then(pl.lit("value")).otherwise(pl.lit("content"))
    size = msgs.list.eval(content.str.len_bytes()).list.sum()
    # A conversation may end with the assistant turn being regenerated (ShareGPT rows do);
    # what generation needs is a user message to answer, and the last one must say something.
    user_texts = msgs.list.eval(content.filter(role == "user"))
    reason = (
        pl.when(pl.col("reason").is_not_null())
        .then(pl.col("reason"))
        # UltraChat rows carry their first user message again as `prompt`: that is no conflict.
        .when(pl.col("has_messages") & pl.col("has_prompt") & pl.col("row_format").is_null())
        .then(pl.lit("has both messages and prompt (and prompt is not its first user message)"))
        .when(pl.col("has_conversations") & pl.col("has_messages"))
        .then(pl.lit("has both conversations and messages"))
        .when(pl.col("has_conversations") & pl.col("has_prompt"))
        .then(pl.lit("has both conversations and prompt"))
        .when(~pl.col("has_messages") & ~pl.col("has_prompt") & ~pl.col("has_conversations"))
        .then(pl.lit("has neither messages nor prompt nor conversations"))
        .when(pl.col("row_format").is_null() & (turns.list.len() == 0))
        .then(pl.lit("conversations is empty"))
    )
    reason = (
        reason.when(
            pl.col("system").is_not_null() & (row_format == "messages") & ~pl.col("turns_as_roles")
        )
        .then(pl.lit("system is for prompt and conversations rows; put a system message first"))
        .when(
            _system_given()
            & (
                (sharegpt & turns.list.eval(speaker == "system").list.any())
                | (pl.col("turns_as_roles") & pl.col("raw_roles").list.contains("system"))
            )
        )
        .then(pl.lit("system given twice: the system key and a system turn"))
        .when(pl.col("given_id").is_not_null() & (pl.col("given_id").str.len_bytes() == 0))
        .then(pl.lit("id is empty"))
        # Only messages rows have roles before normalising (a ShareGPT row's empty list has
        # no format of its own and was rejected above).
        .when(pl.col("raw_roles").list.len() == 0)
        .then(
            pl.when(pl.col("turns_as_roles"))
            .then(pl.lit("conversations is empty"))
            .otherwise(pl.lit("messages is empty"))
        )
        .when(sharegpt & turns.list.eval(speaker.is_null()).list.any())
        .then(pl.format("message {}: from is missing", bad_from_at))
        .when(sharegpt & turns.list.eval(bad_from).list.any())
        .then(
            pl.format(
                "message {}: from {} is not human, gpt or system "
                "(nor user, assistant, chatgpt, bing, bard)",
                bad_from_at,
                turns.list.get(bad_from_at, null_on_oob=True).struct.field("from").str.slice(0, 20),
            )
        )
        .when(msgs.list.eval(role.is_null()).list.any())
        .then(pl.format("message {}: role is missing", bad_role_at))
        .when(msgs.list.eval(role.is_in(ROLES).not_()).list.any())
        .then(
            pl.format(
                "message {}: role {} is not user/system/assistant",
                bad_role_at,
                msgs.list.get(bad_role_at, null_on_oob=True).struct.field("role").str.slice(0, 20),
            )
        )
        .when(msgs.list.eval(content.is_null()).list.any())
        .then(pl.format("message {}: {} is missing or null", null_content_at, text_key))
        .when(user_texts.list.len() == 0)
        .then(pl.lit("no user message"))
        .when(user_texts.list.last().str.strip_chars().str.len_bytes() == 0)
        .then(pl.lit("empty prompt"))
        .when(size > max_prompt_bytes)
        .then(pl.format("prompt is {} bytes, over the limit of {} bytes", size, max_prompt_bytes))
    )
    normalised = _normalised(
        fields.with_columns(
            raw_roles=msgs.list.eval(role),
            **{f"has_{k}": pl.col(k).is_not_null() for k in FORMAT_KEYS.values()},
        )
    )
    checked = normalised.with_columns(reason=reason)
    return checked.with_columns(id=_ids(checked))


def _normalised(fields: pl.DataFrame) -> pl.DataFrame:
    """Each row's `messages` by its own format: a prompt is one user message, ShareGPT turns
    become {role, content}, and a `system` beside a prompt or beside conversation turns
    (LLaMA-Factory's layout) becomes a first system message.

    polars computes every branch of a when/then for every row, so only the branches of the
    formats present are built: a file of one format costs what it did before mixing existed.
    """
    row_format = pl.col("row_format")
    present = set(fields.get_column("row_format").drop_nulls().unique())
    messages = pl.col("messages")
    if "sharegpt" in present:
        turn = pl.element().struct
        sharegpt = pl.col("conversations").list.eval(
            pl.struct(
                role=turn.field("from").replace_strict(
                    SHAREGPT_ROLES, default=None, return_dtype=pl.String
                ),
                content=turn.field("value"),
            )
        )
        messages = pl.when(row_format == "sharegpt").then(sharegpt).otherwise(messages)
    if "prompt" in present:
        user = pl.struct(role=pl.lit("user"), content=pl.col("prompt"))
        messages = pl.when(row_format == "prompt").then(pl.concat_list(user)).otherwise(messages)
    system_first = ((row_format == "prompt") & pl.col("system").is_not_null()) | (
        ((row_format == "sharegpt") | pl.col("turns_as_roles")) & _system_given()
    )
    return _system_first(fields.with_columns(messages=messages), system_first)


def _system_first(frame: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
    """`system` put before the `messages` of the rows `where` selects.

    `concat_list` over struct lists takes some 20 µs a row in polars 2.1 (a million prompts
    with a system key: 20 s), so those rows' lists are rebuilt from one long frame of
    messages, grouped back by row, instead.
    """
    rows = frame.with_row_index("_row")
    chosen = rows.filter(where.fill_null(False)).select("_row", "system", "messages")
    if chosen.height == 0:
        return frame
    system = pl.struct(role=pl.lit("system"), content=pl.col("system")).alias("messages")
    long = pl.concat([chosen.select("_row", system), chosen.drop("system").explode("messages")])
    # Groups in order of first appearance: each row's system message, then its turns.
    rebuilt = long.group_by("_row", maintain_order=True).agg(pl.col("messages").alias("_rebuilt"))
    return (
        rows.join(rebuilt, on="_row", how="left", maintain_order="left")
        .with_columns(messages=pl.coalesce("_rebuilt", "messages"))
        .drop("_row", "_rebuilt")
    )


def _system_given() -> pl.Expr:
    """A `system` key beside conversation turns; a blank one is no system prompt (it would
    replace the chat template's default with nothing)."""
    return pl.col("system").str.strip_chars().str.len_bytes().fill_null(0) > 0


def _ids(checked: pl.DataFrame) -> pl.Series:
    """The given id, or `h-` + 16 hex of sha256 over the normalised messages.

    The hashed text is length-prefixed (`role:len:content` per message), so it is unambiguous
    and does not depend on how any JSON encoder escapes text.
    """
    element = pl.element().struct
    canonical = (
        pl.col("messages")
        .list.eval(
            element.field("role")
            + ":"
            + element.field("content").str.len_bytes().cast(pl.String)
            + ":"
            + element.field("content")
        )
        .list.join("\n")
    )
    need = checked.select(
        pl.when(pl.col("given_id").is_null() & pl.col("reason").is_null()).then(canonical)
    ).to_series()
    hashed = need.map_elements(_content_id, return_dtype=pl.String, skip_nulls=True)
    return checked.get_column("given_id").fill_null(hashed).alias("id")


def _content_id(text: str) -> str:
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:16]
