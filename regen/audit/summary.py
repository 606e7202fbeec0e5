"""A shard's audit summary: every figure the checks need, from the rows in hand, mergeable.

The audit used to read the whole dataset into one frame (4.4 GB at 100K rows). A summary holds
counts, a few example ids, value counts of integer lengths (so quantiles stay exact after a
merge) and hashed answers with counts (for the collapse check): a few kB per shard. The final
audit, the rolling audit during a run and a canary's gate all merge summaries, so they are one
mechanism and agree by construction.

The measuring side: `audit_rows` fills a summary and `merge` adds summaries up; they must change
with the summary's fields (`regen.audit.summary_model`), or a merged audit stops equalling one
over all rows. The checks that grade the figures import the models, never this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import TypeVar

import polars as pl

from regen.audit.by_setting import setting_counts, setting_examples
from regen.audit.checks.template_parity import parity_figures
from regen.audit.checks.tool_calls import CALL_TOKEN, tool_figures
from regen.audit.dataset import answer_snippets, per_turn
from regen.audit.features import collect_features
from regen.audit.loss_mask import measure_loss_mask, stored_ids
from regen.audit.registry import FLAGS
from regen.audit.result import Example
from regen.audit.servers import server_flags, server_rates
from regen.audit.settings import AuditSettings
from regen.audit.summary_model import (
    Answers,
    Hits,
    LossFigures,
    ParityFigures,
    Summary,
    ToolFigures,
)
from regen.config import AuditConfig

LENGTH_COLUMNS = ["prompt_tokens", "reasoning_tokens", "completion_tokens", "answer_tokens"]
K = TypeVar("K", str, int)


def audit_rows(
    rows: pl.DataFrame, settings: AuditSettings, *, sources: dict[int, str] | None = None
) -> Summary:
    """The summary of rows in hand (one shard's, or a canary's): every figure, no verdict.

    `sources` names the data the rows came from (shard -> digest); by default, the shards in
    the rows' `shard` column with no digest.
    """
    config, k = settings.config, settings.config.max_examples
    conversations = rows.lazy()
    features = collect_features(conversations, FLAGS, config)
    stored = stored_ids(conversations)
    # Completeness and errors count conversations; the answer checks count every turn. The
    # text features are the costly part: computed again only where turns were split.
    if stored.multi_turn:
        turn_rows = per_turn(conversations)
        ok = collect_features(turn_rows, FLAGS, config).filter(~pl.col("is_error"))
    else:
        turn_rows, ok = conversations, features.filter(~pl.col("is_error"))
    loss = measure_loss_mask(conversations, stored, settings.model, ok.height, config.batch_rows)

    def hits(frame: pl.DataFrame, flag: pl.Expr, reason: pl.Expr) -> Hits:
        found = frame.filter(flag)
        shown = found.head(k).select("id", reason.alias("reason"))
        return Hits(
            n=found.height, examples=[Example(id=i, reason=r) for i, r in shown.iter_rows()]
        )

    flags = {c.name: c.amend(hits(ok, c.hit(config), c.reason(config)), turn_rows) for c in FLAGS}
    # Reasoning lengths are those of the answers that thought: a row drawn to thinking off
    # (regeneration.thinking_mix) has none by design, not a tiny one.
    thought = ok.filter(pl.col("thinks"))
    of = {c: thought if c == "reasoning_tokens" else ok for c in LENGTH_COLUMNS}
    tiny = {
        c: hits(of[c], pl.col(c) <= config.tiny_length_tokens, pl.format(f"{c} = {{}}", pl.col(c)))
        for c in LENGTH_COLUMNS
    }
    lengths = {c: _value_counts(of[c][c]) for c in LENGTH_COLUMNS}
    kinds = dict(ok["empty_answer"].drop_nulls().value_counts().iter_rows())
    counts = server_rates(features, config, settings.thinking)
    finish = features.group_by("finish_reason").len()
    # Samples in row order, so the examples are the first rows, as every other check's are.
    order = ok.select("id").with_row_index("_pos")
    tokens = loss.tokens.join(order, on="id", how="left").sort("_pos", nulls_last=True)
    short = tokens.filter(pl.col("loss_tokens") <= config.min_loss_tokens).select(
        "id", "loss_tokens"
    )
    return Summary(
        settings=settings.key,
        max_examples=k,
        sources=sources
        if sources is not None
        else {int(s): "" for s in rows["shard"].unique().drop_nulls()},
        rows=features.height,
        # An error row's example says why (`HTTP 400: ... maximum context length ...`).
        errors=hits(features, pl.col("is_error"), error_reason()),
        finish_reasons={r: int(n) for r, n in finish.iter_rows()},
        completions=ok.height,
        flags=flags,
        empty_kinds={str(kind): int(n) for kind, n in kinds.items()},
        tiny=tiny,
        lengths=lengths,
        answers=_answers(ok, turn_rows, k),
        servers={row.pop("server"): row for row in counts.iter_rows(named=True)},
        server_examples=_server_examples(features, config, settings.thinking, k),
        thinking_completions=thought.height,
        by_setting=setting_counts(features, ok, config, settings.thinking),
        setting_examples=setting_examples(features, ok, config, settings.thinking, k),
        loss=LossFigures(
            turns=loss.turns,
            from_ids=loss.from_ids,
            from_template=loss.from_template,
            short=Hits(
                n=short.height,
                examples=[
                    Example(id=i, reason=f"{n} loss tokens") for i, n in short.head(k).iter_rows()
                ],
            ),
            tokens=_value_counts(loss.tokens["loss_tokens"]),
        ),
        parity=parity_figures(rows, settings.model, settings.parity_rows, k),
        tools=tool_figures(rows, _call_token(settings), k),
    )


def _call_token(settings: AuditSettings) -> int | None:
    """The model's `<tool_call>` token, where its tokenizer has one (the tool-calls check)."""
    template = settings.model.template
    found = template.tokenizer.token_to_id(CALL_TOKEN) if template is not None else None
    return found if isinstance(found, int) else None


ERROR_REASON_CHARS = 160
"""An error example's reason at most: the server's message names the cause in its first words
(a 200,000-character prompt's HTTP 400 quotes none of it)."""


def error_reason() -> pl.Expr:
    """`error row: <the row's error>`, cut to `ERROR_REASON_CHARS`, one line."""
    text = pl.col("error").fill_null("").str.replace_all(r"\s+", " ").str.strip_chars()
    cut = (
        pl.when(text.str.len_chars() > ERROR_REASON_CHARS)
        .then(text.str.slice(0, ERROR_REASON_CHARS - 1) + pl.lit("…"))
        .otherwise(text)
    )
    return pl.when(text == "").then(pl.lit("error row")).otherwise(pl.lit("error row: ") + cut)


def merge(summaries: Iterable[Summary]) -> Summary:
    """The figures over all the summaries' rows, examples in the order given (shard order for
    the final audit, commit order for the rolling audit). Summaries made with other settings
    cannot be merged: their figures mean other things."""
    parts = list(summaries)
    if not parts:
        raise ValueError("nothing to merge")
    first = parts[0]
    if any(p.settings != first.settings for p in parts):
        raise ValueError("summaries made with different audit settings cannot be merged")
    if len(parts) == 1:
        return first.model_copy(deep=True)
    k = first.max_examples

    def add_hits(items: list[Hits]) -> Hits:
        examples = [e for h in items for e in h.examples][:k]
        return Hits(n=sum(h.n for h in items), examples=examples)

    def keyed_hits(field: str) -> dict[str, Hits]:
        names = dict.fromkeys(n for p in parts for n in getattr(p, field))
        return {
            n: add_hits([getattr(p, field)[n] for p in parts if n in getattr(p, field)])
            for n in names
        }

    servers, examples = _add_keyed([(p.servers, p.server_examples) for p in parts], k)
    by_setting, setting_ids = _add_keyed([(p.by_setting, p.setting_examples) for p in parts], k)
    # Built from validated summaries: validating the merged lists again would cost seconds.
    return Summary.model_construct(
        settings=first.settings,
        max_examples=k,
        sources={s: d for p in parts for s, d in p.sources.items()},
        rows=sum(p.rows for p in parts),
        errors=add_hits([p.errors for p in parts]),
        finish_reasons=_add_counts(p.finish_reasons for p in parts),
        completions=sum(p.completions for p in parts),
        flags=keyed_hits("flags"),
        empty_kinds=_add_counts(p.empty_kinds for p in parts),
        tiny=keyed_hits("tiny"),
        lengths={
            c: _add_counts(p.lengths.get(c, {}) for p in parts)
            for c in dict.fromkeys(c for p in parts for c in p.lengths)
        },
        answers=merge_answers([p.answers for p in parts], k),
        servers=dict(sorted(servers.items())),
        server_examples=examples,
        thinking_completions=sum(p.thinking_completions for p in parts),
        by_setting=dict(sorted(by_setting.items())),
        setting_examples=setting_ids,
        loss=LossFigures(
            turns=sum(p.loss.turns for p in parts),
            from_ids=sum(p.loss.from_ids for p in parts),
            from_template=sum(p.loss.from_template for p in parts),
            short=add_hits([p.loss.short for p in parts]),
            tokens=_add_counts(p.loss.tokens for p in parts),
        ),
        parity=ParityFigures.merge([p.parity for p in parts], k),
        tools=ToolFigures.merge([p.tools for p in parts], k),
    )


def _add_keyed(
    parts: list[tuple[dict[str, dict[str, int]], dict[str, dict[str, list[str]]]]], k: int
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, list[str]]]]:
    """Counts per key (server, setting) added figure by figure, and their first `k` ids per
    defect, in the order given."""
    counts: dict[str, dict[str, int]] = {}
    examples: dict[str, dict[str, list[str]]] = {}
    for figures_by_key, ids_by_key in parts:
        for key, figures in figures_by_key.items():
            into = counts.setdefault(key, {})
            for name, n in figures.items():
                into[name] = into.get(name, 0) + n
        for key, by_flag in ids_by_key.items():
            into_ids = examples.setdefault(key, {})
            for name, ids in by_flag.items():
                into_ids[name] = (into_ids.get(name, []) + ids)[:k]
    return counts, examples


def merge_answers(parts: list[Answers], k: int, keep: int | None = None) -> Answers:
    """Counts added by answer hash, first ids kept in order; with `keep`, only the `keep` most
    common answers (the rolling audit's bound: a pruned answer's count is lost, so a later
    collapse is under-counted by at most the count it had, itself under 1/`keep` of rows)."""
    counts = (
        pl.concat([a.counts for a in parts])
        .group_by("key", maintain_order=True)
        .agg(pl.col("n").sum(), pl.col("snippet").first())
    )
    ids = pl.concat([a.ids for a in parts])
    if keep is not None and counts.height > keep:
        counts = counts.sort("n", descending=True, maintain_order=True).head(keep)
        ids = ids.filter(pl.col("key").is_in(counts["key"].implode()))
    return Answers(counts=counts, ids=ids.group_by("key", maintain_order=True).head(k))


def _answers(ok: pl.DataFrame, rows: pl.LazyFrame, k: int) -> Answers:
    keyed = ok.filter(pl.col("answer_key").is_not_null()).select(key="answer_key", id="id")
    counts = keyed.group_by("key", maintain_order=True).agg(n=pl.len(), first=pl.col("id").first())
    snippets = answer_snippets(rows, counts["first"].to_list())
    counts = counts.select(
        "key",
        pl.col("n").cast(pl.Int64),
        snippet=pl.col("first").replace_strict(snippets, default="", return_dtype=pl.String),
    )
    return Answers(counts=counts, ids=keyed.group_by("key", maintain_order=True).head(k))


def _server_examples(
    features: pl.DataFrame, config: AuditConfig, thinking: bool, k: int
) -> dict[str, dict[str, list[str]]]:
    """Per server and defect, its first ids: the server_outlier check's examples, whichever
    server it names."""
    out: dict[str, dict[str, list[str]]] = {}
    ok = ~pl.col("is_error")
    named = {
        "error": pl.col("is_error"),
        **{n: ok & f.fill_null(False) for n, f in server_flags(config, thinking).items()},
    }
    for name, flag in named.items():
        found = (
            features.filter(flag).group_by("server", maintain_order=True).agg(pl.col("id").head(k))
        )
        for server, ids in found.iter_rows():
            out.setdefault(server, {})[name] = ids
    return out


def _value_counts(values: pl.Series) -> dict[int, int]:
    counts = values.drop_nulls().cast(pl.Int64).value_counts(sort=False)
    return {int(v): int(n) for v, n in counts.iter_rows()}


def _add_counts(parts: Iterable[dict[K, int]]) -> dict[K, int]:
    """Counts added by key; in one polars pass, as a million rows bring ~10^6 entries."""
    dicts = [p for p in parts if p]
    if len(dicts) <= 1:
        return dict(dicts[0]) if dicts else {}
    frame = pl.DataFrame(
        {
            "key": list(chain.from_iterable(dicts)),
            "n": list(chain.from_iterable(d.values() for d in dicts)),
        }
    )
    summed = frame.group_by("key", maintain_order=True).agg(pl.col("n").sum())
    return dict(zip(summed["key"].to_list(), summed["n"].to_list(), strict=True))
