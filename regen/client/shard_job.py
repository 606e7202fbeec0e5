"""One submitted shard: its rows as the dispatcher needs them, and its output columns.

Rows stay in their polars frame until the shard reaches the head of the queue, so a
flow that submits all 2,000 shards of a 1M-prompt run at once holds Arrow buffers, not
a million Python dicts; the Python lists exist only for the shards being dispatched.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import polars as pl

from regen.client.response import Completion
from regen.schema import TURN, row_schema

_RESULT_COLUMNS = (
    "content",
    "reasoning_content",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "model",
    "server",
    "attempts",
    "latency_s",
    "error",
)


class ShardJob:
    """Filled from the dispatcher's loop thread only; `future` is read by the shard's thread."""

    __slots__ = ("_columns", "_frame", "cursor", "future", "ids", "messages", "remaining", "shard")

    def __init__(self, shard: int, rows: pl.DataFrame) -> None:
        missing = {"id", "messages"} - set(rows.columns)
        if missing:
            raise ValueError(f"shard {shard}: rows lack column(s) {sorted(missing)}")
        self.shard = shard
        self._frame = rows.select("id", "messages")
        self.future: concurrent.futures.Future[pl.DataFrame] = concurrent.futures.Future()
        self.future.set_running_or_notify_cancel()
        self.remaining = rows.height
        self.cursor = 0
        self.ids: list[str] = []
        self.messages: list[list[dict[str, str]]] = []
        self._columns: dict[str, list[Any]] = {}
        if not self.size:
            self.materialize()
            self.future.set_result(self._result())

    @property
    def size(self) -> int:
        return self._frame.height

    def materialize(self) -> None:
        """Turn the frame into the Python lists requests are built from (once, at the head)."""
        if self._columns:
            return
        self.ids = self._frame["id"].to_list()
        self.messages = self._frame["messages"].to_list()
        self._columns = {name: [None] * self.size for name in _RESULT_COLUMNS}

    def is_open(self) -> bool:
        return not self.future.done()

    def complete(
        self, pos: int, completion: Completion, server: str, attempts: int, latency_s: float
    ) -> None:
        c = self._columns
        c["content"][pos] = completion.content
        c["reasoning_content"][pos] = completion.reasoning_content
        c["finish_reason"][pos] = completion.finish_reason
        c["prompt_tokens"][pos] = completion.prompt_tokens
        c["completion_tokens"][pos] = completion.completion_tokens
        c["reasoning_tokens"][pos] = completion.reasoning_tokens
        c["model"][pos] = completion.model
        self._finish(pos, server, attempts, latency_s, None)

    def fail(
        self, pos: int, error: str, server: str | None, attempts: int, latency_s: float | None
    ) -> None:
        self._finish(pos, server, attempts, latency_s, error)

    def _finish(
        self,
        pos: int,
        server: str | None,
        attempts: int,
        latency_s: float | None,
        error: str | None,
    ) -> None:
        c = self._columns
        c["server"][pos] = server
        c["attempts"][pos] = attempts
        c["latency_s"][pos] = latency_s
        c["error"][pos] = error
        self.remaining -= 1
        if self.remaining == 0 and self.is_open():
            try:
                self.future.set_result(self._result())
            except Exception as err:  # e.g. messages of another shape: fail, never hang
                self.future.set_exception(err)
            self.release()

    def abort(self, error: BaseException) -> None:
        if self.is_open():
            self.future.set_exception(error)
        self.release()

    def release(self) -> None:
        """Drop the per-row Python objects once nothing will be dispatched from this shard."""
        self.ids = []
        self.messages = []
        self._columns = {}

    def _result(self) -> pl.DataFrame:
        schema = row_schema()
        results = pl.DataFrame(
            self._columns, schema={name: schema[name] for name in _RESULT_COLUMNS}
        )
        frame = self._frame.with_columns(
            pl.lit(self.shard, pl.Int64).alias("shard"),
            pl.col("messages").list.eval(
                pl.struct(
                    pl.element().struct.field("role"),
                    pl.element().struct.field("content"),
                    pl.lit(None, pl.String).alias("reasoning_content"),
                )
            ),
        )
        turn = pl.struct(
            pl.col("messages")
            .list.eval(pl.element().struct.field("role") == "user")
            .list.sum()
            .cast(pl.Int64)
            .alias("turn"),
            "finish_reason",
            "prompt_tokens",
            "completion_tokens",
            "reasoning_tokens",
            pl.lit(None, pl.String).alias("reasoning_effort"),
            "server",
            "attempts",
            "latency_s",
        )
        out = pl.concat([frame, results], how="horizontal")
        return (
            out.with_columns(
                pl.when(pl.col("error").is_null())
                .then(pl.concat_list(turn))
                .otherwise(pl.lit([], pl.List(TURN)))
                .alias("turns")
            )
            .select(schema.names())
            .cast(schema)
        )
