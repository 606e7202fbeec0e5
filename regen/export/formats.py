"""Each trainer format as a polars transform of one shard's committed ok rows.

Conversation formats (specforge, messages) keep one line per conversation; token formats
(tokenized, hf-dataset) take one sample per assistant turn from `regen.lossmask`, the one
loss-mask function the audit uses too. Every dropped row or sample is counted by reason.

Text is written exactly as the server returned it. SGLang's Qwen3 reasoning parser leaves
`content` starting with "\n\n" and `reasoning_content` ending in "\n"; SpecForge's own
`scripts/regenerate_train_data.py` stores both as returned, and the trainer's chat template
strips them when it renders (`reasoning_content.strip('\n')`, `content.lstrip('\n')` in
Qwen3's), so stripping here would only make our files differ from SpecForge's.
`reasoning_content` is written only where there is one: SpecForge's script adds the key
only when it saves reasoning, and a template treats a missing key and null alike.

A conversation with tools (regen.tools) keeps its calls (`tool_calls`, arguments as JSON
text) and results (role `tool`, `tool_call_id`) in OpenAI's shape, which SpecForge's parser
and speculators' normaliser both take, and carries `tools` beside it as JSON text (what both
parse per row; a JSON list of differing schemas would not load as one Arrow column), written
as SGLang handed them to the chat template (regen.tools.template_tools), so a trainer that
renders the conversation renders the tools the server rendered, token for token.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from regen.config import TOKEN_FORMATS, ExportOptions
from regen.lossmask import ROW_COLUMNS, ChatTemplate, samples
from regen.schema import TOOL_CALL
from regen.tools import template_tools

JSONL_KEY = {"specforge": "conversations", "messages": "messages"}
"""The conversation key of each conversation format."""


@dataclass
class ShardExport:
    """One shard's output frame and what was left out of it, by reason."""

    frame: pl.DataFrame
    rows: int
    """Committed rows of the shard that are not error rows (the export's candidates)."""
    error_rows: int
    rows_exported: int
    samples: int
    dropped: Counter[str] = field(default_factory=Counter)
    no_system: int = 0
    """Conversations exported without a system message (a trainer's template may add one)."""
    input_turns: int = 0
    """Assistant turns that came with the input, left out by `generated_only`."""


def shard_export(
    rows: pl.LazyFrame,
    options: ExportOptions,
    template: ChatTemplate | None = None,
    *,
    enable_thinking: bool = True,
    generated_only: bool = False,
) -> ShardExport:
    """The output of one shard: conversation lines or token samples, filtered.

    Only the columns the format needs are read (the token ids are most of a shard's bytes).
    Token formats take a turn without stored ids from `template` (the model's chat template and
    tokenizer) when one is given, as the audit does; without one such a turn is dropped."""
    if options.format in TOKEN_FORMATS:
        columns = ROW_COLUMNS if template is not None else ["id", "error", "turns"]
    else:
        columns = ["id", "error", "messages", "content", "reasoning_content", "finish_reason"]
        columns += ["completion_tokens", "tools"]
        columns += ["turns"] if options.exclude_truncated else []
    # Frames of another reader's making may lack the newer columns (tools, sampling).
    present = set(rows.collect_schema().names())
    frame = rows.select([c for c in columns if c in present]).collect()
    if "tools" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, pl.String).alias("tools"))
    if options.format not in TOKEN_FORMATS and frame["tools"].is_not_null().any():
        # A turns=last answer's calls are in its turn record: read only where tools are.
        last_calls = pl.col("turns").list.last().struct.field("tool_calls")
        frame = frame.with_columns(rows.select(last_calls.alias("_answer_calls")).collect())
    ok = frame.filter(pl.col("error").is_null())
    errors = frame.height - ok.height
    if options.format in TOKEN_FORMATS:
        found = samples(ok, options.turns, template, enable_thinking=enable_thinking)
        return _token_samples(ok, errors, options, found.collect())
    return _conversations(ok, errors, options, generated_only)


def _truncated_turn() -> pl.Expr:
    return pl.element().struct.field("finish_reason") == "length"


def _conversations(
    ok: pl.DataFrame, errors: int, options: ExportOptions, generated_only: bool
) -> ShardExport:
    """A row is one line; it is truncated when any of its turns stopped at max_tokens."""
    turn_truncated = (
        pl.col("turns").list.eval(_truncated_turn()).list.any().fill_null(False)
        if "turns" in ok.columns
        else pl.lit(False)
    )
    flagged = ok.with_columns(
        _truncated=turn_truncated | (pl.col("finish_reason") == "length").fill_null(False),
        # The trained tokens of a conversation: every answer it holds (the turns' sum).
        _loss=pl.col("completion_tokens").fill_null(0),
    )
    dropped: Counter[str] = Counter()
    if options.exclude_truncated:
        dropped["truncated"] = int(flagged["_truncated"].sum())
        flagged = flagged.filter(~pl.col("_truncated"))
    if options.min_loss_tokens:
        keep = pl.col("_loss") >= options.min_loss_tokens
        dropped["min_loss_tokens"] = flagged.height - int(flagged.select(keep.sum()).item())
        flagged = flagged.filter(keep)
    key = JSONL_KEY[options.format]
    lines = flagged.select(_jsonl_line(key, generated_only, "_answer_calls" in flagged.columns))
    first_role = pl.col("messages").list.first().struct.field("role")
    no_system = int(flagged.select((first_role != "system").fill_null(True).sum()).item() or 0)
    input_turns = 0
    if generated_only:
        # What conversation() leaves out: the assistant messages of a row that ends unanswered.
        role = pl.col("messages").list.eval(pl.element().struct.field("role") == "assistant")
        answered = role.list.last().fill_null(False)
        left_out = pl.when(answered).then(0).otherwise(role.list.sum())
        input_turns = int(flagged.select(left_out.sum()).item() or 0)
    return ShardExport(
        lines,
        ok.height,
        errors,
        lines.height,
        lines.height,
        dropped,
        no_system=no_system,
        input_turns=input_turns,
    )


def conversation(generated_only: bool = False, answer_calls: bool = False) -> pl.Expr:
    """The whole conversation with its final answer: with `turns: all` `messages` already ends
    with it; with `turns: last` it ends with the user turn and the answer is in `content`.

    `generated_only` (a `turns: last` dataset): the assistant messages of `messages` came with
    the input, not from the model, so they are left out and only the answer is trained. The
    trainer then sees the user turns back to back, a context the server never saw; the token
    formats keep the server's context and train the answer alone."""
    answer = pl.struct(
        role=pl.lit("assistant"),
        content=pl.col("content"),
        reasoning_content=pl.col("reasoning_content"),
        tool_calls=pl.col("_answer_calls") if answer_calls else pl.lit(None, pl.List(TOOL_CALL)),
        tool_call_id=pl.lit(None, pl.String),
    )
    ends_answered = pl.col("messages").list.last().struct.field("role") == "assistant"
    messages = pl.col("messages")
    if generated_only:
        # The input's answers and calls go, and with the calls their results.
        role = pl.element().struct.field("role")
        messages = messages.list.filter((role != "assistant") & (role != "tool"))
    return (
        pl.when(ends_answered.fill_null(False))
        .then(pl.col("messages"))
        .otherwise(pl.concat_list(messages, answer))
    )


def _jsonl_line(key: str, generated_only: bool = False, answer_calls: bool = False) -> pl.Expr:
    """One JSON object per row, encoded by polars (no Python loop): `{"id", key: [...]}`.

    A polars list holds one struct type, so every message encodes a `reasoning_content`; where
    it is null that is exactly `,"reasoning_content":null}` (the struct's last field), which
    cannot occur inside an encoded string (its quotes are escaped), so removing it leaves the
    key out of those messages only.
    """
    line = pl.struct(
        pl.col("id"),
        conversation(generated_only, answer_calls).alias(key),
        pl.col("tools")
        .map_elements(_template_tools, return_dtype=pl.String, skip_nulls=True)
        .alias("tools"),
    ).struct.json_encode()
    # A message's null keys (and a row's null tools) cannot occur quoted inside encoded text,
    # whose quotes are escaped: removing them leaves the key out where it has no value.
    for key in ("reasoning_content", "tool_calls", "tool_call_id", "tools"):
        line = line.str.replace_all(f',"{key}":null', "", literal=True)
    return line.alias("line")


def _template_tools(text: str) -> str:
    return json.dumps(template_tools(json.loads(text)), ensure_ascii=False)


def _token_samples(
    ok: pl.DataFrame, errors: int, options: ExportOptions, samples: pl.DataFrame
) -> ShardExport:
    """Filter and name the samples of `regen.lossmask.samples`; a turn it gave none (no ids,
    no template) is counted as `no_token_ids`."""
    n_turns = pl.col("turns").list.len().fill_null(0)
    candidates = int(
        ok.select(
            (n_turns if options.turns == "each" else (n_turns > 0).cast(pl.Int64)).sum()
        ).item()
        or 0
    )
    multi = options.turns == "each" and bool(ok.select((n_turns > 1).any()).item())
    if multi or options.exclude_truncated:
        # Per-turn facts the samples lack; a shard is small, so the join is cheap.
        turn = pl.col("turns").struct
        info = (
            ok.select("id", "turns", _multi=n_turns > 1)
            .explode("turns")
            .select(
                "id",
                "_multi",
                turn.field("turn").alias("turn"),
                (turn.field("finish_reason") == "length").fill_null(False).alias("_truncated"),
            )
        )
        samples = samples.join(info, on=["id", "turn"], how="left", maintain_order="left")
    else:
        samples = samples.with_columns(_multi=pl.lit(False), _truncated=pl.lit(False))
    dropped: Counter[str] = Counter({"no_token_ids": candidates - samples.height})
    if options.exclude_truncated:
        dropped["truncated"] = int(samples["_truncated"].sum())
        samples = samples.filter(~pl.col("_truncated"))
    if options.min_loss_tokens:
        keep = pl.col("loss_tokens") >= options.min_loss_tokens
        dropped["min_loss_tokens"] = samples.height - int(samples.select(keep.sum()).item())
        samples = samples.filter(keep)
    # The audit's convention (regen.audit.dataset.per_turn): a turn of a multi-turn
    # conversation is `<id>#t<turn>`, the one sample of a one-turn row keeps the row's id.
    sample_id = (
        pl.when(pl.col("_multi") & pl.lit(options.turns == "each"))
        .then(pl.format("{}#t{}", "id", "turn"))
        .otherwise(pl.col("id"))
    )
    columns = [sample_id.alias("id"), "input_ids", "loss_mask"]
    if options.format == "hf-dataset":
        columns.append("seq_len")
    out = samples.select(columns)
    exported_rows = samples.get_column("id").n_unique() if samples.height else 0
    return ShardExport(out, ok.height, errors, exported_rows, out.height, dropped)
