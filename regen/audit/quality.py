"""Checks 2-7: what is wrong inside the completions (error rows are left out of all of them)."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from regen.audit.result import Check, Example, grade
from regen.audit.thresholds import AuditConfig, Threshold

Snippets = Callable[[list[str]], dict[str, str]]
"""Short answer snippets by id: model output, fetched only for the few examples shown."""


def completions(features: pl.DataFrame) -> pl.DataFrame:
    return features.filter(~pl.col("is_error"))


def _flag_check(
    name: str,
    title: str,
    ok: pl.DataFrame,
    flag: pl.Expr,
    reason: pl.Expr,
    threshold: Threshold,
    config: AuditConfig,
    detail: str,
) -> Check:
    if ok.height == 0:
        return Check(name=name, title=title, status="skipped", figure=None, detail="no completions")
    hits = ok.filter(flag)
    rate = hits.height / ok.height
    shown = hits.head(config.max_examples).select("id", reason.alias("reason"))
    return Check(
        name=name,
        title=title,
        status=grade(rate, threshold),
        figure=rate,
        warn=threshold.warn,
        fail=threshold.fail,
        examples=[Example(id=i, reason=r) for i, r in shown.iter_rows()],
        detail=f"{hits.height} of {ok.height} completions {detail}",
    )


def empty_answer_check(ok: pl.DataFrame, config: AuditConfig, snippets: Snippets) -> Check:
    """Check 2: empty, filler ('OK.') or too short to teach anything."""
    check = _flag_check(
        "empty_answer",
        "2 empty/trivial answers",
        ok,
        pl.col("empty_answer").is_not_null(),
        pl.when(pl.col("empty_answer") == "short")
        .then(pl.format("short: {} tokens", pl.col("answer_tokens")))
        .otherwise(pl.col("empty_answer")),
        config.empty_answer,
        config,
        "have an empty, filler or trivial answer",
    )
    if ok.height:
        kinds = dict(ok["empty_answer"].drop_nulls().value_counts().iter_rows())
        check.detail += (
            f" (empty {kinds.get('empty', 0)}, filler {kinds.get('filler', 0)}, "
            f"under {config.min_answer_tokens} tokens {kinds.get('short', 0)})"
        )
    fillers = snippets([e.id for e in check.examples if e.reason == "filler"])
    for e in check.examples:
        if e.id in fillers:
            e.reason = f"filler: {fillers[e.id]!r}"
    return check


def empty_thinking_check(ok: pl.DataFrame, config: AuditConfig, thinking: bool) -> Check:
    """Check 3: thinking was asked for, yet the reasoning is empty."""
    if not thinking:
        return Check(
            name="empty_thinking",
            title="3 empty thinking",
            status="skipped",
            figure=None,
            detail="no reasoning stored by design (regeneration.thinking is drop or off)",
        )
    return _flag_check(
        "empty_thinking",
        "3 empty thinking",
        ok,
        pl.col("empty_thinking"),
        pl.lit("empty reasoning_content"),
        config.empty_thinking,
        config,
        "have no reasoning although thinking was requested",
    )


def think_leak_check(ok: pl.DataFrame, config: AuditConfig) -> Check:
    """Check 4: the reasoning parser missed a tag, so thinking leaks into the answer."""
    return _flag_check(
        "think_leak",
        "4 think-tag leakage",
        ok,
        pl.col("think_leak"),
        pl.lit("<think> tag in content or unbalanced in reasoning"),
        config.think_leak,
        config,
        "have a think tag in the answer or unbalanced tags in the reasoning",
    )


def truncation_checks(ok: pl.DataFrame, config: AuditConfig) -> list[Check]:
    """Check 5: cut off by max_tokens; inside the thinking means no answer at all."""
    return [
        _flag_check(
            "truncation",
            "5 truncation",
            ok,
            pl.col("truncated"),
            pl.lit("finish_reason length"),
            config.truncated,
            config,
            "stopped at max_tokens (finish_reason length)",
        ),
        _flag_check(
            "truncated_in_thinking",
            "5 truncated in thinking",
            ok,
            pl.col("truncated_in_thinking"),
            pl.lit("finish_reason length, no answer"),
            config.truncated_in_thinking,
            config,
            "ran out of tokens inside the thinking and have no answer",
        ),
    ]


def repetition_check(ok: pl.DataFrame, config: AuditConfig) -> Check:
    """Check 6: a decoding loop, a span repeated over most of a response."""
    return _flag_check(
        "repetition",
        "6 repetition loops",
        ok,
        pl.col("repetition") >= config.repetition_share,
        pl.format(
            "{}% of {}-grams repeated",
            (100 * pl.col("repetition")).round(0).cast(pl.Int64),
            pl.lit(config.repetition_ngram),
        ),
        config.repetition,
        config,
        f"repeat {config.repetition_ngram}-word spans over at least "
        f"{config.repetition_share:.0%} of the reasoning or the answer",
    )


def answer_collapse_check(ok: pl.DataFrame, config: AuditConfig, snippets: Snippets) -> Check:
    """Check 7: the share of the single most common (normalised) answer."""
    name, title = "answer_collapse", "7 answer collapse"
    keyed = ok.filter(pl.col("answer_key").is_not_null())
    if ok.height == 0:
        return Check(name=name, title=title, status="skipped", figure=None, detail="no completions")
    if keyed.height == 0:
        top_rows = keyed
        rate = 0.0
    else:
        counts = keyed.group_by("answer_key").len().sort("len", descending=True)
        top_key, top_n = counts.row(0)
        top_rows = keyed.filter(pl.col("answer_key") == top_key)
        rate = top_n / ok.height
    # A "most common" answer seen once is no collapse: nothing to show.
    shown = top_rows.head(config.max_examples) if top_rows.height > 1 else top_rows.head(0)
    ids = shown["id"].to_list()
    text = snippets(top_rows.head(1)["id"].to_list())
    snippet = next(iter(text.values()), "")
    return Check(
        name=name,
        title=title,
        status=grade(rate, config.answer_collapse),
        figure=rate,
        warn=config.answer_collapse.warn,
        fail=config.answer_collapse.fail,
        examples=[Example(id=i, reason=f"answer {snippet!r}") for i in ids],
        # The answer itself is shown only in the report's examples: model output can echo
        # the prompt, and the detail goes to logs.
        detail=f"most common answer on {top_rows.height} of {ok.height} completions",
    )
