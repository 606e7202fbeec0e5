"""Template parity: the model directory's chat template renders what the server was sent.

A trainer renders text with the template it is given; if that is not the one the server
used, every sample's context differs from what the target saw. Where turns store the
server's `prompt_token_ids`, each stored prompt is rendered again here (the conversation
before the turn, add_generation_prompt, run.json's thinking) and compared token by token.

Up to `template_parity_rows` rows are compared (0: every row), spread evenly over the
planned shards and evenly within each: each shard's summary renders its share as it is
committed. A template mismatch
is systematic — one template renders every row — so it shows on a large share of rows, or
on a class of them (system prompts, later turns, odd characters); 5,000
rows catch a class of 0.06 % of rows with 95 % probability, in seconds (4.6 s on a busy
2-core machine), where rendering a million rows in Python would take minutes.
"""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import AuditCheck
from regen.audit.loss_mask import ModelTemplate
from regen.audit.result import Check, Example, graded, skipped
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import ParityFigures, Summary
from regen.config import AuditConfig
from regen.lossmask import ROW_COLUMNS, ChatTemplate
from regen.lossmask.conversation import turn_inputs
from regen.lossmask.parity import PromptDifference, prompt_differences


def parity_figures(rows: pl.DataFrame, model: ModelTemplate, quota: int, k: int) -> ParityFigures:
    """Render up to `quota` of the rows that store prompt ids (evenly spread; 0: all of them)
    and compare them with what the server was sent."""
    if model.template is None:
        return ParityFigures()
    stored = pl.element().struct.field("prompt_token_ids").is_not_null()
    part = rows.select(ROW_COLUMNS).filter(
        pl.col("turns").list.eval(stored).list.any().fill_null(False)
    )
    without = rows.height - part.height
    if quota and part.height > quota:
        part = part.gather_every(part.height // quota).head(quota)
    turns = [t for row in part.iter_rows(named=True) for t in turn_inputs(row)]
    diffs = prompt_differences(model.template, turns, model.enable_thinking)
    multi = set(part.filter(pl.col("turns").list.len() > 1)["id"].to_list())
    return ParityFigures(
        rows=part.height,
        compared=sum(t.prompt_token_ids is not None for t in turns),
        without=without,
        shards=1,
        differ=len(diffs),
        examples=[
            Example(
                id=f"{d.id}#t{d.turn}" if d.id in multi else d.id,
                reason=_reason(d, model.template),
            )
            for d in diffs[:k]
        ],
    )


class TemplateParity(AuditCheck):
    name = "template_parity"
    title = "template parity"
    threshold = "template_parity"
    reads_answers = False  # the prompts the server was sent

    def grade(self, summary: Summary, settings: AuditSettings) -> Check:
        found, shards = summary.parity, len(summary.sources)
        return template_parity_check(found, settings.model, settings.config, shards)

    def sampled(self, summary: Summary, settings: AuditSettings) -> int | None:
        return summary.parity.compared


CHECK = TemplateParity()


def template_parity_check(
    found: ParityFigures, model: ModelTemplate, config: AuditConfig, shards: int
) -> Check:
    """The share of compared prompts whose tokens differ from the template's rendering."""
    name, title = CHECK.name, CHECK.title
    if model.template is None:
        return skipped(name, title, model.missing)
    if found.compared == 0:
        detail = "no stored prompt_token_ids (older dataset or a server that returns none)"
        return skipped(name, title, detail)
    rate = found.differ / found.compared
    return graded(
        name,
        title,
        rate,
        CHECK.limit(config),
        examples=found.examples,
        detail=f"{found.differ:,} of {found.compared:,} stored prompts differ from the template in "
        f"{model.template.path.name} ({found.rows:,} rows of {found.shards:,} of {shards:,} shards "
        "checked"
        + (f"; {found.without:,} rows there store no prompt ids)" if found.without else ")"),
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
