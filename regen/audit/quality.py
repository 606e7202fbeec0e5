"""Checks 2-7: what is wrong inside the completions (error rows are left out of all of them)."""

from __future__ import annotations

import polars as pl

from regen.audit.result import Check, Example, graded, skipped
from regen.audit.summary_model import Hits, Summary
from regen.config import AuditConfig, Threshold


def _flag_check(
    name: str,
    title: str,
    summary: Summary,
    threshold: Threshold,
    detail: str,
    of: int | None = None,
) -> Check:
    """`of`: the completions the figure is a share of, when not all of them."""
    ok = summary.completions if of is None else of
    if ok == 0:
        return skipped(name, title, "no completions")
    hits = summary.flags.get(name, Hits())
    rate = hits.n / ok
    return graded(
        name,
        title,
        rate,
        threshold,
        examples=[e.model_copy() for e in hits.examples],
        detail=f"{hits.n:,} of {ok:,} completions {detail}",
    )


def empty_answer_check(summary: Summary, config: AuditConfig) -> Check:
    """Check 2: empty, filler ('OK.') or too short to teach anything."""
    check = _flag_check(
        "empty_answer",
        "2 empty/trivial answers",
        summary,
        config.empty_answer,
        "have an empty, filler or trivial answer",
    )
    if summary.completions:
        kinds = summary.empty_kinds
        check.detail += (
            f" (empty {kinds.get('empty', 0)}, filler {kinds.get('filler', 0)}, "
            f"under {config.min_answer_tokens} tokens {kinds.get('short', 0)})"
        )
    return check


def empty_thinking_check(summary: Summary, config: AuditConfig, thinking: bool) -> Check:
    """Check 3: thinking was asked for, yet the reasoning is empty."""
    if not thinking:
        return skipped(
            "empty_thinking",
            "3 empty thinking",
            "no reasoning stored by design (regeneration.thinking is drop or off)",
        )
    # Over the rows that asked for thinking: none of a thinking_mix's off rows is counted.
    # A summary made before it was counted (every row thought) reads 0: all completions.
    of = summary.thinking_completions or summary.completions
    return _flag_check(
        "empty_thinking",
        "3 empty thinking",
        summary,
        config.empty_thinking,
        "have no reasoning although thinking was requested",
        of=of,
    )


def think_leak_check(summary: Summary, config: AuditConfig) -> Check:
    """Check 4: the reasoning parser missed a tag, so thinking leaks into the answer."""
    return _flag_check(
        "think_leak",
        "4 think-tag leakage",
        summary,
        config.think_leak,
        "have a think tag in the answer or unbalanced tags in the reasoning",
    )


def truncation_checks(summary: Summary, config: AuditConfig) -> list[Check]:
    """Check 5: cut off by max_tokens; inside the thinking means no answer at all."""
    return [
        _flag_check(
            "truncation",
            "5 truncation",
            summary,
            config.truncated,
            "stopped at max_tokens (finish_reason length)",
        ),
        _flag_check(
            "truncated_in_thinking",
            "5 truncated in thinking",
            summary,
            config.truncated_in_thinking,
            "ran out of tokens inside the thinking and have no answer",
        ),
    ]


def repetition_check(summary: Summary, config: AuditConfig) -> Check:
    """Check 6: a decoding loop, a span repeated over most of a response."""
    return _flag_check(
        "repetition",
        "6 repetition loops",
        summary,
        config.repetition,
        f"repeat {config.repetition_ngram}-word spans over at least "
        f"{config.repetition_share:.0%} of the reasoning or the answer",
    )


def answer_collapse_check(summary: Summary, config: AuditConfig) -> Check:
    """Check 7: the share of the single most common (normalised) answer; ties go to the
    answer seen first."""
    name, title = "answer_collapse", "7 answer collapse"
    ok = summary.completions
    if ok == 0:
        return skipped(name, title, "no completions")
    answers = summary.answers
    top_n, ids, snippet = 0, [], ""
    if answers.counts.height:
        top = answers.counts.sort("n", descending=True, maintain_order=True).row(0, named=True)
        top_n, snippet = top["n"], top["snippet"]
        ids = answers.ids.filter(pl.col("key") == top["key"])["id"].to_list()
    # A "most common" answer seen once is no collapse: nothing to show.
    shown = ids if top_n > 1 else []
    rate = top_n / ok
    return graded(
        name,
        title,
        rate,
        config.answer_collapse,
        # Not even among 4 rows: 1 of 4 is 25 %, over the default fail threshold.
        status=None if top_n > 1 else "pass",
        examples=[Example(id=i, reason=f"answer {snippet!r}") for i in shown],
        # The answer itself is shown only in the report's examples: model output can echo
        # the prompt, and the detail goes to logs.
        detail=f"most common answer on {top_n:,} of {ok:,} completions",
    )
