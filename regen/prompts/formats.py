"""The three row formats and the words they share: OpenAI `messages`, `prompt` (+ `system`)
and ShareGPT `conversations`, whichever file type (JSONL or Parquet) they come in."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from regen.schema import TOOL_CALL

ROLES = ("system", "user", "assistant", "tool")
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
    # Tool calls and their results (regen.prompts.tool_rows): LLaMA-Factory's speakers.
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
    "function_response": "tool",
}
# Format name -> the key (column) that carries it.
FORMAT_KEYS = {"messages": "messages", "prompt": "prompt", "sharegpt": "conversations"}
MIXED = "mixed"
# A row's format once known, as a small categorical column.
FORMAT = pl.Enum(list(FORMAT_KEYS))

# A `conversations` turn as read: ShareGPT's {from, value}, or {role, content} as SpecForge's
# prepare_data writes it (those rows are OpenAI messages under another key).
ANY_TURN = pl.Struct(
    {
        "from": pl.String,
        "value": pl.String,
        "role": pl.String,
        "content": pl.String,
        "tool_calls": pl.List(TOOL_CALL),
        "tool_call_id": pl.String,
    }
)


@dataclass(frozen=True)
class Columns:
    """Where a file keeps what the row formats otherwise find by their own names:
    `input.id_column` (UltraChat's `prompt_id`) and `input.messages_column`, a conversation
    under another name, read as `conversations` (either turn style); naming one sets the
    row's other format columns aside, so an UltraChat-style `prompt` beside it is not read."""

    id: str = "id"
    messages: str | None = None

    def renames(self) -> dict[str, str]:
        """Source column -> the name the readers know it by."""
        renames = {self.id: "id"} if self.id != "id" else {}
        if self.messages:
            renames[self.messages] = "conversations"
        return renames

    def set_aside(self) -> set[str]:
        """Columns of the file left unread: those the renamed ones stand in for."""
        aside = {"id"} if self.id != "id" else set()
        if self.messages:
            aside |= set(FORMAT_KEYS.values())
        return aside - set(self.renames())

    def key(self, target: str) -> str:
        """The config key that named the column read as `target`, for messages."""
        return "input.id_column" if target == "id" else "input.messages_column"


# What a file without `input.id_column` / `input.messages_column` is read with.
AS_NAMED = Columns()


def format_name(formats: dict[str, int]) -> str:
    """The one format of a file's valid rows, or `mixed` when they use several."""
    return next(iter(formats)) if len(formats) == 1 else MIXED


def format_counts(formats: dict[str, int]) -> str:
    """`messages 600, prompt 400`: the per-format figure a user sees."""
    return ", ".join(f"{fmt} {count}" for fmt, count in formats.items())


def split_conversations(messages: pl.Expr, turns: pl.Expr) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
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
    chat = turns.list.eval(
        pl.struct(
            turn.field("role"),
            turn.field("content"),
            turn.field("tool_calls"),
            turn.field("tool_call_id"),
        )
    )
    sharegpt = turns.list.eval(
        pl.struct(turn.field("from"), turn.field("value"), turn.field("tool_calls"))
    )
    return (
        pl.when(as_roles).then(chat).otherwise(messages).alias("messages"),
        pl.when(as_roles).then(None).otherwise(sharegpt).alias("conversations"),
        as_roles.fill_null(False).alias("turns_as_roles"),
    )
