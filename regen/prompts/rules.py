"""The row rules, shared by both file types: each row's own format, the first reason it is
unusable, its messages normalised to OpenAI chat, and its id (given or hashed)."""

from __future__ import annotations

import hashlib

import polars as pl

from regen.prompts.formats import FORMAT_KEYS, ROLES, SHAREGPT_ROLES
from regen.schema import TOOL_CALL


def message(role: pl.Expr, content: pl.Expr) -> pl.Expr:
    """A MESSAGE struct without tool fields (a prompt, a system key)."""
    return pl.struct(
        role.alias("role"),
        content.alias("content"),
        pl.lit(None, pl.List(TOOL_CALL)).alias("tool_calls"),
        pl.lit(None, pl.String).alias("tool_call_id"),
    )


def row_format() -> pl.Expr:
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


def check_rows(fields: pl.DataFrame, max_prompt_bytes: int) -> pl.DataFrame:
    """Adds the normalised `messages`, the final `id` and the first failing `reason` per row;
    each row is checked and normalised by its own `row_format`. Duplicate ids span batches:
    `load._split_duplicates` finds them once every batch is checked."""
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
    # A tool result answers a call: it follows an assistant message with tool_calls (or
    # another result of the same calls).
    calls = pl.element().struct.field("tool_calls")
    answers_call = (role.shift(1) == "tool") | (
        (role.shift(1) == "assistant") & calls.shift(1).list.len().fill_null(0).gt(0)
    )
    stray_tool = (role == "tool") & ~answers_call.fill_null(False)
    stray_tool_at = msgs.list.eval(stray_tool).list.arg_max()
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
                "(nor user, assistant, chatgpt, bing, bard, function_call, observation, tool)",
                bad_from_at,
                turns.list.get(bad_from_at, null_on_oob=True).struct.field("from").str.slice(0, 20),
            )
        )
        .when(msgs.list.eval(role.is_null()).list.any())
        .then(pl.format("message {}: role is missing", bad_role_at))
        .when(msgs.list.eval(role.is_in(ROLES).not_()).list.any())
        .then(
            pl.format(
                "message {}: role {} is not user/system/assistant/tool",
                bad_role_at,
                msgs.list.get(bad_role_at, null_on_oob=True).struct.field("role").str.slice(0, 20),
            )
        )
        .when(msgs.list.eval(content.is_null()).list.any())
        .then(pl.format("message {}: {} is missing or null", null_content_at, text_key))
        .when(msgs.list.eval(stray_tool).list.any())
        .then(
            pl.format(
                "message {}: a tool result must follow an assistant message with tool_calls",
                stray_tool_at,
            )
        )
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
                tool_calls=turn.field("tool_calls"),
                tool_call_id=pl.lit(None, pl.String),
            )
        )
        messages = pl.when(row_format == "sharegpt").then(sharegpt).otherwise(messages)
    if "prompt" in present:
        user = message(pl.lit("user"), pl.col("prompt"))
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
    system = message(pl.lit("system"), pl.col("system")).alias("messages")
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
    and does not depend on how any JSON encoder escapes text. A message's calls or the id of
    the call it answers, and the row's tools, are added where there are some (a row without
    them hashes as it always did).
    """
    element = pl.element().struct
    calls = pl.struct(element.field("tool_calls")).struct.json_encode()
    tool_extra = pl.when(element.field("tool_calls").is_not_null()).then(
        ":calls:" + calls
    ).otherwise(pl.lit("")) + pl.when(element.field("tool_call_id").is_not_null()).then(
        ":answers:" + element.field("tool_call_id")
    ).otherwise(pl.lit(""))
    canonical = pl.col("messages").list.eval(
        element.field("role")
        + ":"
        + element.field("content").str.len_bytes().cast(pl.String)
        + ":"
        + element.field("content")
        + tool_extra
    ).list.join("\n") + pl.when(pl.col("tools").is_not_null()).then(
        "\ntools:" + pl.col("tools")
    ).otherwise(pl.lit(""))
    need = checked.select(
        pl.when(pl.col("given_id").is_null() & pl.col("reason").is_null()).then(canonical)
    ).to_series()
    hashed = need.map_elements(_content_id, return_dtype=pl.String, skip_nulls=True)
    return checked.get_column("given_id").fill_null(hashed).alias("id")


def _content_id(text: str) -> str:
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:16]
