"""The `audit:` section: thresholds and knobs of the quality audit."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Threshold(BaseModel):
    """A figure over 0 and at or above `warn` warns, at or above `fail` fails the gate."""

    model_config = ConfigDict(extra="forbid")

    warn: float = Field(ge=0.0, le=1.0, description="A figure over 0 and at or above this warns.")
    fail: float = Field(ge=0.0, le=1.0, description="A figure over 0 and at or above this fails.")

    @model_validator(mode="after")
    def _ordered(self) -> Threshold:
        if self.warn > self.fail:
            raise ValueError(f"warn {self.warn} is above fail {self.fail}")
        return self


# The checks `not_judged` may name: every row check, each a module of regen/audit/checks/
# listed by regen.audit.registry (a test holds the two equal). Completeness and rejects are
# not among them: every input id once is the dataset's one promise, whatever its text.
RowCheck = Literal[
    "error_rows", "empty_answer", "empty_thinking", "think_leak", "truncation",
    "truncated_in_thinking", "aborted", "repetition", "language_switch", "answer_collapse",
    "tiny_length", "server_outlier", "per_setting", "loss_mask", "template_parity", "tool_calls",
]  # fmt: skip


class AuditConfig(BaseModel):
    """What the gate tolerates before it calls a dataset unfit for training."""

    model_config = ConfigDict(extra="forbid")

    rejects: Threshold = Field(
        default=Threshold(warn=0.0, fail=0.01),
        description="Share of input rows rejected (bad JSON, wrong types, empty, duplicate "
        "ids): any warns; above 1 % the dataset is not what was asked for.",
    )
    error_rate: Threshold = Field(
        default=Threshold(warn=0.01, fail=0.05),
        description="error_rows: share of rows stored as errors (the server failed them every "
        "attempt).",
    )
    empty_answer: Threshold = Field(
        default=Threshold(warn=0.01, fail=0.05),
        description="empty_answer: share of answers empty, a filler (filler_answers) or under "
        "min_answer_tokens.",
    )
    empty_thinking: Threshold = Field(
        default=Threshold(warn=0.01, fail=0.05),
        description="empty_thinking: share of rows asked to think whose reasoning is empty.",
    )
    think_leak: Threshold = Field(
        default=Threshold(warn=0.005, fail=0.02),
        description="think_leak: share of answers with a think tag in them (the reasoning "
        "parser missed it).",
    )
    truncated: Threshold = Field(
        default=Threshold(warn=0.05, fail=0.2),
        description="truncation: share of answers cut at max_tokens (finish_reason length).",
    )
    truncated_in_thinking: Threshold = Field(
        default=Threshold(warn=0.01, fail=0.05),
        description="truncated_in_thinking: share of answers whose tokens ran out inside the "
        "thinking, so there is no answer.",
    )
    aborted: Threshold = Field(
        default=Threshold(warn=0.0, fail=0.0),
        description="aborted: share of stored answers the server cut short (finish_reason "
        "abort); regen retries those and never stores one, so any fails.",
    )
    repetition: Threshold = Field(
        default=Threshold(warn=0.01, fail=0.05),
        description="repetition: share of rows in a decoding loop (see repetition_ngram).",
    )
    language_switch: Threshold = Field(
        default=Threshold(warn=0.02, fail=0.1),
        description="language_switch: share of mostly Latin-script prompts answered mostly in "
        "CJK (Qwen drifting into Chinese); rare in a healthy run.",
    )
    answer_collapse: Threshold = Field(
        default=Threshold(warn=0.05, fail=0.2),
        description="answer_collapse: share of the single most common answer.",
    )
    tiny_length: Threshold = Field(
        default=Threshold(warn=0.02, fail=0.1),
        description="tiny_length: share of answers at or under tiny_length_tokens.",
    )
    server_outlier: Threshold = Field(
        default=Threshold(warn=0.02, fail=0.1),
        description="server_outlier: how far one server's defect rate is above the other "
        "servers' (it must also be server_outlier_ratio times theirs); the live gate "
        "quarantines such a server.",
    )
    loss_mask_short: Threshold = Field(
        default=Threshold(warn=0.01, fail=0.05),
        description="loss_mask: share of samples with at most min_loss_tokens trained tokens.",
    )
    template_parity: Threshold = Field(
        default=Threshold(warn=0.0, fail=0.01),
        description="template_parity: share of stored prompts the model's chat template "
        "renders differently from what the server was sent; any warns (a trainer would see "
        "other tokens).",
    )
    tool_calls: Threshold = Field(
        default=Threshold(warn=0.0, fail=0.02),
        description="tool_calls: share of the model's calls that are malformed, name an "
        "undeclared tool or were dropped by the parser; any warns.",
    )

    min_answer_tokens: int = Field(default=4, ge=0, description="Shorter answers are trivial.")
    filler_answers: list[str] = Field(
        default=["OK.", "OK", "Ok.", "Sure.", "Sure", "Yes.", "No.", "Done."],
        description="Answers that count as empty (compared without case or extra spaces).",
    )
    tiny_length_tokens: int = Field(
        default=8,
        ge=0,
        description="A length at or under this is the tiny-length check's 'tiny' bucket.",
    )
    min_loss_tokens: int = Field(
        default=16, ge=0, description="A sample whose loss mask has at most this many tokens."
    )
    repetition_ngram: int = Field(
        default=6, ge=2, description="Words per n-gram of the repetition check."
    )
    repetition_min_words: int = Field(
        default=24, ge=2, description="Texts with fewer words are too short to call a loop."
    )
    repetition_share: float = Field(
        default=0.5, gt=0, le=1, description="Share of repeated n-grams that makes a loop."
    )
    server_outlier_ratio: float = Field(
        default=3.0, ge=1, description="A server this many times worse than the rest is flagged."
    )
    template_parity_rows: int = Field(
        default=5000,
        ge=0,
        description="Rows whose stored prompts template parity renders again (evenly spread, "
        "deterministic); 0 renders every row.",
    )
    max_examples: int = Field(
        default=5, ge=0, description="Example ids a check names in the report."
    )
    not_judged: list[RowCheck] = Field(
        default_factory=list,
        description="Checks measured and reported but never graded, here or by the live gate: "
        "for text that cannot pass them, such as a random-weight model's in a dress rehearsal.",
    )
    live: Literal["stop", "warn", "off"] = Field(
        default="stop",
        description="While generating, a check over its fail threshold stops the run (stop), "
        "is only reported (warn), or the running figures are not judged at all (off).",
    )
    live_min_rows: int = Field(
        default=2000,
        ge=0,
        description="Rows committed before the rolling audit may stop a run: a few early rows "
        "over a threshold are chance, not a broken run.",
    )
    batch_rows: int = Field(
        default=100_000, ge=1000, description="Rows per batch of the scan; bounds peak memory."
    )
