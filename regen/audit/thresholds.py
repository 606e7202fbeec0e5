"""Thresholds of the quality audit; part of `RegenConfig.audit`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Threshold(BaseModel):
    """A rate at or above `warn` warns, at or above `fail` fails the gate."""

    model_config = ConfigDict(extra="forbid")

    warn: float = Field(ge=0.0, le=1.0)
    fail: float = Field(ge=0.0, le=1.0)


class AuditConfig(BaseModel):
    """What the gate tolerates before it calls a dataset unfit for training."""

    model_config = ConfigDict(extra="forbid")

    error_rate: Threshold = Threshold(warn=0.01, fail=0.05)
    empty_answer: Threshold = Threshold(warn=0.01, fail=0.05)
    empty_thinking: Threshold = Threshold(warn=0.01, fail=0.05)
    think_leak: Threshold = Threshold(warn=0.005, fail=0.02)
    truncated: Threshold = Threshold(warn=0.05, fail=0.2)
    repetition: Threshold = Threshold(warn=0.01, fail=0.05)
    answer_collapse: Threshold = Threshold(warn=0.05, fail=0.2)
    min_answer_tokens: int = Field(default=4, ge=0)
    filler_answers: list[str] = ["OK.", "OK", "Ok.", "Sure.", "Sure", "Yes.", "No.", "Done."]
