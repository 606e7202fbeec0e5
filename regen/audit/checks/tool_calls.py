"""Tool calls: the model's tool calls, in the conversations that have tools.

A draft trained on calls learns their tokens; a call the target wrote wrong teaches nothing
useful and shows a run that went wrong (a template that renders no tools, a parser that does
not fit the model). Per generated turn of a row with `tools` (regen.tools):

- malformed: a stored call with no function name or arguments that are not a JSON object;
- unknown: a stored call naming a function the row's tools do not declare (SGLang drops
  those unless SGLANG_FORWARD_UNKNOWN_TOOLS is set; another server may keep them);
- dropped: a call block in the model's own tokens (its `<tool_call>` token, where the model's
  tokenizer has one) that the server's parser turned into no call: JSON it could not read or
  an undeclared function, which SGLang leaves out of `tool_calls` and of `content` alike.

The figure is (malformed + unknown + dropped) over the calls the model wrote. The detail also
counts the conversations the regeneration rule stopped (the model's calls differed from the
given ones, `TURN.tool_stop`): not a defect of the data, but tool turns the dataset lacks.
"""

from __future__ import annotations

import json

import polars as pl

from regen.audit.checks.base import AuditCheck
from regen.audit.result import Check, Example, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import Hits, Summary, ToolFigures
from regen.config import AuditConfig
from regen.tools import tool_names

CALL_TOKEN = "<tool_call>"


def tool_figures(rows: pl.DataFrame, call_token: int | None, k: int) -> ToolFigures:
    """The figures of the rows with tools (only those are read)."""
    if "tools" not in rows.columns:
        return ToolFigures()
    with_tools = rows.filter(pl.col("tools").is_not_null() & pl.col("error").is_null())
    if with_tools.height == 0:
        return ToolFigures()
    turns = (
        with_tools.select("id", "tools", "turns", multi=pl.col("turns").list.len() > 1)
        .explode("turns")
        .filter(pl.col("turns").is_not_null())
        .select(
            "id",
            "tools",
            "multi",
            pl.col("turns").struct.field("turn"),
            pl.col("turns").struct.field("tool_calls"),
            pl.col("turns").struct.field("tool_stop"),
            (
                pl.col("turns")
                .struct.field("response_token_ids")
                .list.eval((pl.element() == (call_token if call_token is not None else -1)).sum())
                .list.first()
                .fill_null(0)
                .alias("blocks")
            ),
        )
    )
    malformed, unknown, dropped, stopped = Hits(), Hits(), Hits(), Hits()
    calls = 0
    for row in turns.iter_rows(named=True):
        where = f"{row['id']}#t{row['turn']}" if row["multi"] else row["id"]
        made = row["tool_calls"] or []
        calls += len(made)
        declared = set(tool_names(row["tools"]))
        for call in made:
            function = call.get("function") or {}
            name, why = function.get("name"), _malformed(function)
            if why:
                _hit(malformed, where, why, k)
            elif name not in declared:
                _hit(unknown, where, f"calls {name}, which the row's tools do not declare", k)
        if call_token is not None and row["blocks"] > len(made):
            lost = row["blocks"] - len(made)
            _hit(dropped, where, f"{lost} call block(s) in its tokens parsed to no call", k)
        if row["tool_stop"]:
            _hit(stopped, where, row["tool_stop"], k)
    return ToolFigures(
        rows=with_tools.height,
        turns=turns.height,
        calls=calls,
        counted_blocks=call_token is not None,
        malformed=malformed,
        unknown=unknown,
        dropped=dropped,
        stopped=stopped,
    )


def _malformed(function: dict[str, object]) -> str | None:
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        return "a call with no function name"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return f"the arguments of {name} are not a JSON object"
    return None


def _hit(hits: Hits, where: str, reason: str, k: int) -> None:
    hits.n += 1
    if len(hits.examples) < k:
        hits.examples.append(Example(id=where, reason=reason[:160]))


class ToolCalls(AuditCheck):
    name = "tool_calls"
    title = "tool calls"
    threshold = "tool_calls"
    # A call's form (a name, JSON arguments) is the parser's and the template's, not the text's.
    reads_answers = False

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        return tool_calls_check(summary.tools, settings.config)

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        return None


CHECK = ToolCalls()


def tool_calls_check(found: ToolFigures, config: AuditConfig) -> Check:
    name, title = CHECK.name, CHECK.title
    if found.rows == 0:
        return skipped(name, title, "no conversation has tools")
    bad = found.malformed.n + found.unknown.n + found.dropped.n
    written = found.calls + found.dropped.n
    if written == 0:
        return skipped(
            name, title, f"{found.rows:,} conversations have tools; the model called none"
        )
    blocks = "" if found.counted_blocks else "; dropped blocks not counted (no tokenizer)"
    return graded(
        name,
        title,
        bad / written,
        CHECK.limit(config),
        examples=(found.malformed.examples + found.unknown.examples + found.dropped.examples)[:5],
        detail=f"{bad:,} of {written:,} calls the model wrote are bad ({found.malformed.n:,} "
        f"malformed, {found.unknown.n:,} to unknown tools, {found.dropped.n:,} dropped by the "
        f"parser) in {found.turns:,} turns of {found.rows:,} conversations with tools; "
        f"{found.stopped.n:,} conversations stopped where the model's calls differed from the "
        f"given ones{blocks}",
    )
