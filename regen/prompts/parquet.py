"""Parquet rows read in row slices, their columns checked and cast to the shape a decoded
JSONL line has, so the row rules see one layout whichever file type the rows came in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

from regen.errors import UserError
from regen.prompts.formats import ANY_TURN, AS_NAMED, FORMAT_KEYS, Columns, split_conversations
from regen.schema import MESSAGE, TOOL_CALL
from regen.tools import normalize_tools


def row_count(path: Path, name: str) -> int:
    """The file's rows, from its metadata."""
    try:
        return int(pl.scan_parquet(path).select(pl.len()).collect().item())
    except pl.exceptions.PolarsError as err:
        raise UserError(f"{name}: not a readable Parquet file: {_first_line(err)}") from None


def batches(
    path: Path,
    name: str,
    size: int,
    n_rows: int | None,
    batch_bytes: int,
    names: Columns = AS_NAMED,
    windows: list[tuple[int, int]] | None = None,
) -> Iterator[pl.DataFrame]:
    """The rows in slices of some `batch_bytes` of the file each, numbered from 1; or only
    the rows of each (start, length) window."""
    try:
        scan = pl.scan_parquet(path, n_rows=n_rows)
        schema = scan.collect_schema()
        total = scan.select(pl.len()).collect().item()
    except pl.exceptions.PolarsError as err:
        raise UserError(f"{name}: not a readable Parquet file: {_first_line(err)}") from None
    if renames := names.renames():
        for source, target in renames.items():
            if source not in schema:
                raise UserError(
                    f"{name}: has no column {source} (named by {names.key(target)}); "
                    f"columns: {', '.join(schema.names())}"
                )
        scan = scan.drop(names.set_aside() & set(schema.names())).rename(renames)
        schema = scan.collect_schema()
    columns = [_parquet_id(schema, name)]
    messages, conversations = schema.get("messages"), schema.get("conversations")
    if messages is not None:
        columns.append(_parquet_messages(messages, name))
    else:
        columns.append(pl.lit(None, dtype=pl.List(MESSAGE)).alias("messages"))
    if conversations is not None:
        columns.append(_parquet_turns(conversations, name))
    else:
        columns.append(pl.lit(None, dtype=pl.List(ANY_TURN)).alias("conversations"))
    if "tools" not in schema:
        columns.append(pl.lit(None, dtype=pl.String).alias("tools"))
    elif schema["tools"] in (pl.String, pl.Null):
        # JSON text, as the Hermes function-calling set keeps it; normalised like a JSONL row's.
        columns.append(
            pl.col("tools")
            .cast(pl.String)
            .map_elements(_tools_text, return_dtype=pl.String, skip_nulls=True)
        )
    else:
        raise UserError(
            f"{name}: column tools has type {schema['tools']}, expected JSON text (a string)"
        )
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
    split = split_conversations(pl.col("messages"), pl.col("conversations"))
    step = max(1, total * batch_bytes // size)
    spans = windows or [(start, step) for start in range(0, total, step)]
    for start, step in spans:
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
    text = [
        turn.field(key).cast(pl.String) if key in fields else pl.lit(None, pl.String).alias(key)
        for key in keys
    ]
    tool_fields = [
        turn.field(key).cast(dtype) if key in fields else pl.lit(None, dtype).alias(key)
        for key, dtype in (("tool_calls", pl.List(TOOL_CALL)), ("tool_call_id", pl.String))
    ]
    return pl.col("conversations").list.eval(pl.struct(*text, *tool_fields))


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
    element = pl.element().struct
    tool_fields = []
    tool_dtypes: tuple[tuple[str, pl.DataType], ...] = (
        ("tool_calls", pl.List(TOOL_CALL)),
        ("tool_call_id", pl.String()),
    )
    for field, dtype in tool_dtypes:
        if field in fields and column == "messages":
            tool_fields.append(element.field(field).cast(dtype))
        else:
            tool_fields.append(pl.lit(None, dtype).alias(field))
    return pl.col(column).list.eval(
        pl.struct(element.field(who), element.field(text).cast(pl.String), *tool_fields)
    )


def _tools_text(text: str) -> str | None:
    """A tools cell as regen.tools keeps it; a cell it cannot read stays as it is, and the
    request it goes with is refused by the server with the reason (an error row)."""
    try:
        return normalize_tools(text)
    except ValueError:
        return text


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
