"""Check 11: the model directory's chat template renders what the server was sent.

A trainer renders text with the template it is given; if that is not the one the server
used, every sample's context differs from what the target saw. Where turns store the
server's `prompt_token_ids`, each stored prompt is rendered again here (the conversation
before the turn, add_generation_prompt, run.json's thinking) and compared token by token.

Rows are taken every k-th in shard order, up to `template_parity_rows` (0: every row). A
template mismatch is systematic — one template renders every row — so it shows on a large
share of rows, or on a class of them (system prompts, later turns, odd characters); 5,000
rows catch a class of 0.06 % of rows with 95 % probability, in a second or two, where
rendering a million rows in Python would take minutes.
"""

from __future__ import annotations

import math

import polars as pl

from regen.audit.loss_mask import ModelTemplate
from regen.audit.result import Check, Example, grade
from regen.audit.thresholds import AuditConfig
from regen.lossmask import ROW_COLUMNS, ChatTemplate
from regen.lossmask.conversation import turn_inputs
from regen.lossmask.parity import PromptDifference, prompt_differences


def template_parity_check(rows: pl.LazyFrame, model: ModelTemplate, config: AuditConfig) -> Check:
    """The share of compared prompts whose tokens differ from the template's rendering."""
    name, title = "template_parity", "11 template parity"
    stored = pl.element().struct.field("prompt_token_ids").is_not_null()
    with_ids = rows.filter(pl.col("turns").list.eval(stored).list.any().fill_null(False))
    available = with_ids.select(pl.len()).collect().item()
    if available == 0:
        detail = "no stored prompt_token_ids (older dataset or a server that returns none)"
        return Check(name=name, title=title, status="skipped", figure=None, detail=detail)
    if model.template is None:
        return Check(name=name, title=title, status="skipped", figure=None, detail=model.missing)
    limit = config.template_parity_rows
    step = math.ceil(available / limit) if limit else 1
    sample = with_ids.select(ROW_COLUMNS).gather_every(step).collect()
    turns = [t for row in sample.iter_rows(named=True) for t in turn_inputs(row)]
    compared = sum(t.prompt_token_ids is not None for t in turns)
    diffs = prompt_differences(model.template, turns, model.enable_thinking)
    rate = len(diffs) / compared if compared else 0.0
    multi = set(sample.filter(pl.col("turns").list.len() > 1)["id"].to_list())
    scope = f"{sample.height} of {available} rows" if step > 1 else f"all {available} rows"
    return Check(
        name=name,
        title=title,
        status=grade(rate, config.template_parity),
        figure=rate,
        warn=config.template_parity.warn,
        fail=config.template_parity.fail,
        examples=[
            Example(
                id=f"{d.id}#t{d.turn}" if d.id in multi else d.id, reason=_reason(d, model.template)
            )
            for d in diffs[: config.max_examples]
        ],
        detail=f"{len(diffs)} of {compared} stored prompts differ from the template in "
        f"{model.template.path.name} ({scope} checked)",
    )


def _reason(d: PromptDifference, template: ChatTemplate) -> str:
    return (
        f"first difference at token {d.position} (stored {d.stored_len}, template "
        f"{d.rendered_len} tokens): stored {_token(d.stored, template)}, "
        f"template {_token(d.rendered, template)}"
    )


def _token(token_id: int | None, template: ChatTemplate) -> str:
    """A special token by name; any other only by id, as it may be prompt text."""
    if token_id is None:
        return "end of prompt"
    if template.is_special(token_id):
        return f"{template.token_text(token_id)!r} ({token_id})"
    return f"id {token_id}"
