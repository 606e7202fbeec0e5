"""The `audit:` section: thresholds and knobs of the quality audit."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Threshold(BaseModel):
    """A rate at or above `warn` warns, at or above `fail` fails the gate."""

    model_config = ConfigDict(extra="forbid")

    warn: float = Field(ge=0.0, le=1.0)
    fail: float = Field(ge=0.0, le=1.0)

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

    # Any rejected input row warns; above 1 % of the input the dataset is not what was asked for.
    rejects: Threshold = Threshold(warn=0.0, fail=0.01)
    error_rate: Threshold = Threshold(warn=0.01, fail=0.05)
    empty_answer: Threshold = Threshold(warn=0.01, fail=0.05)
    empty_thinking: Threshold = Threshold(warn=0.01, fail=0.05)
    think_leak: Threshold = Threshold(warn=0.005, fail=0.02)
    truncated: Threshold = Threshold(warn=0.05, fail=0.2)
    truncated_in_thinking: Threshold = Threshold(warn=0.01, fail=0.05)
    # An answer the server cut short (finish_reason abort) is never stored: any one fails.
    aborted: Threshold = Threshold(warn=0.0, fail=0.0)
    repetition: Threshold = Threshold(warn=0.01, fail=0.05)
    # Answers in CJK to Latin-script prompts (Qwen drifting into Chinese): rare in a healthy run.
    language_switch: Threshold = Threshold(warn=0.02, fail=0.1)
    answer_collapse: Threshold = Threshold(warn=0.05, fail=0.2)
    tiny_length: Threshold = Threshold(warn=0.02, fail=0.1)
    server_outlier: Threshold = Threshold(warn=0.02, fail=0.1)
    loss_mask_short: Threshold = Threshold(warn=0.01, fail=0.05)
    # Any prompt the template renders differently warns: a trainer would see other tokens.
    template_parity: Threshold = Threshold(warn=0.0, fail=0.01)
    # Any bad call warns; over 2 % of the model's calls the run is not what was asked for.
    tool_calls: Threshold = Threshold(warn=0.0, fail=0.02)

    min_answer_tokens: int = Field(default=4, ge=0, description="Shorter answers are trivial.")
    filler_answers: list[str] = ["OK.", "OK", "Ok.", "Sure.", "Sure", "Yes.", "No.", "Done."]
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
    max_examples: int = Field(default=5, ge=0)
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
