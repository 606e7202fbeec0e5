"""Sampling and regeneration: what each request asks for, part of the run's fingerprint."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
)

from regen.config.section import Section


class SamplingSetting(Section):
    """One entry of `sampling.mix`: the parameters it sets (the others are the section's) and
    the share of rows drawn to it."""

    share: float = Field(ge=0, le=1, description="Share of rows sampled with this setting.")
    temperature: float | None = Field(default=None, ge=0, description="Default: the section's.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Default: the section's.")
    top_k: int | None = Field(default=None, ge=-1, description="Default: the section's.")
    min_p: float | None = Field(default=None, ge=0, le=1, description="Default: the section's.")


class SamplingConfig(Section):
    """The sampling parameters of every request; part of the run's fingerprint.

    With `mix`, each row is drawn to one of its settings (a hash of the row id, so a retry,
    a resume or another node draws the same); a setting's unset keys are the section's."""

    max_tokens: int = Field(
        default=4096, ge=1, description="Most tokens one answer may have, thinking included."
    )
    temperature: float = Field(default=0.6, ge=0, description="Sampling temperature.")
    top_p: float = Field(default=0.95, gt=0, le=1, description="Nucleus sampling's top_p.")
    top_k: int = Field(default=20, ge=-1, description="top_k; -1: no limit.")
    min_p: float = Field(default=0.0, ge=0, le=1, description="min_p; 0: off.")
    seed: int = Field(
        default=0,
        ge=0,
        lt=2**63,
        description="The run's seed: each turn of a row is sent a sampling seed drawn from "
        "it, the row's id and the turn (regen.client.seed), stored in the turn; the same "
        "seed, row and server give the same tokens where the servers honour it (SGLang "
        "with engine.deterministic).",
    )
    mix: list[SamplingSetting] = Field(
        default_factory=list,
        description="Shares of rows per sampling setting, e.g. [{temperature: 0.6, top_p: "
        "0.95, share: 0.7}, {temperature: 1.0, share: 0.3}]; empty: every row is sampled "
        "with the section's values.",
    )

    @field_validator("mix")
    @classmethod
    def _mix_shares(cls, value: list[SamplingSetting]) -> list[SamplingSetting]:
        check_shares([s.share for s in value])
        if len(value) == 1:
            raise ValueError("one setting is no mix: set its values on the section instead")
        return value


def check_shares(shares: list[float]) -> None:
    """Shares of a mix: none negative, summing to 1 (never normalised, so a typo in one share
    cannot silently move the others)."""
    if any(share < 0 for share in shares):
        raise ValueError("shares must not be negative")
    total = sum(shares)
    if shares and abs(total - 1.0) > 1e-6:
        raise ValueError(f"shares sum to {total:g}, expected 1")


# sglang 0.5.23's named tiers (it also takes a float in [0, 0.99], which a share table cannot key).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]


class RegenerationConfig(Section):
    """What is regenerated: which assistant turns, and what becomes of the model's thinking.

    Part of the run's fingerprint: each setting changes what a stored row holds, except
    `token_ids`, which only adds the server's ids beside the same text.
    """

    turns: Literal["last", "all"] = Field(
        default="last",
        description="last: answer the final user turn, earlier turns kept as given; "
        "all: regenerate every assistant turn, each on the regenerated history.",
    )
    thinking: Literal["save", "drop", "off"] = Field(
        default="save",
        description="save: think and keep reasoning_content; drop: think, store no reasoning; "
        "off: enable_thinking false.",
    )
    reasoning_effort: dict[ReasoningEffort, float] = Field(
        default_factory=dict,
        description="Share of requests per reasoning_effort, e.g. {low: 0.4, medium: 0.4, "
        "high: 0.2}; empty sends none (for models that take no effort).",
    )
    thinking_mix: dict[bool, float] = Field(
        default_factory=dict,
        description="Share of rows per enable_thinking, e.g. {on: 0.7, off: 0.3} (true/false "
        "too); the rows drawn on follow `thinking` (save or drop); empty: every row follows it.",
    )
    token_ids: bool = Field(
        default=True,
        description="Ask the server for the exact prompt and response token ids "
        "(return_token_ids) and store them per turn, what trainers' input_ids and loss "
        "masks come from; false stores null.",
    )

    @field_validator("reasoning_effort")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        check_shares(list(value.values()))
        return value

    @field_validator("thinking_mix")
    @classmethod
    def _thinking_shares(cls, value: dict[bool, float], info: ValidationInfo) -> dict[bool, float]:
        check_shares(list(value.values()))
        if value and info.data.get("thinking") == "off":
            raise ValueError("needs thinking save or drop (off turns thinking off for every row)")
        return value

    @property
    def enable_thinking(self) -> bool:
        return self.thinking != "off"
