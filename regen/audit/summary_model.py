"""What an audit summary holds: the figures every check grades, as models.

Measuring (`regen.audit.summary`: rows in, a summary out, summaries merged) and grading (the
check modules: a summary's figures against thresholds) both read these; kept apart from both,
so a check never imports the module that measures with it, and none needs a TYPE_CHECKING
import to name them.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from regen.audit.result import Example


class Hits(BaseModel):
    """How many rows a defect hit, and the first few of them."""

    model_config = ConfigDict(extra="forbid")

    n: int = 0
    examples: list[Example] = Field(default_factory=list)


_COUNTS = {"key": pl.UInt64, "n": pl.Int64, "snippet": pl.String}
_IDS = {"key": pl.UInt64, "id": pl.String}


class Answers(BaseModel):
    """Normalised answers by hash: `counts` (key, n, the first row's snippet) in order of first
    appearance, and `ids` (key, id) with each answer's first ids in row order.

    Held as frames (a million answers are ~40 MB there, ~10 times more as Python objects),
    stored as flat JSON lists (fast to load)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    counts: pl.DataFrame = Field(default_factory=lambda: pl.DataFrame(schema=_COUNTS))
    ids: pl.DataFrame = Field(default_factory=lambda: pl.DataFrame(schema=_IDS))

    @model_validator(mode="before")
    @classmethod
    def _from_lists(cls, data: Any) -> Any:
        if isinstance(data, dict) and "key" in data:
            counts = {c: data[c] for c in _COUNTS}
            ids = {"key": data["id_key"], "id": data["id"]}
            return {
                "counts": pl.DataFrame(counts, schema=_COUNTS),
                "ids": pl.DataFrame(ids, schema=_IDS),
            }
        return data

    @model_serializer
    def _to_lists(self) -> dict[str, list[Any]]:
        return {
            **{c: self.counts[c].to_list() for c in _COUNTS},
            "id_key": self.ids["key"].to_list(),
            "id": self.ids["id"].to_list(),
        }

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Answers)
            and self.counts.equals(other.counts)
            and self.ids.equals(other.ids)
        )


class LossFigures(BaseModel):
    """The loss-mask check's figures: loss tokens per sample, and which path measured them."""

    model_config = ConfigDict(extra="forbid")

    turns: int = 0
    from_ids: int = 0
    from_template: int = 0
    short: Hits = Field(default_factory=Hits)
    tokens: dict[int, int] = Field(default_factory=dict)


class ParityFigures(BaseModel):
    """What rendering the sampled rows again found; summed over shards."""

    model_config = ConfigDict(extra="forbid")

    rows: int = 0
    """Rows rendered (those with stored prompt ids, up to the shard's quota)."""
    compared: int = 0
    """Stored prompts compared (a multi-turn row has one per turn)."""
    without: int = 0
    """Rows of the summarised shards that store no prompt ids."""
    shards: int = 0
    """Shards summarised (each renders its quota)."""
    differ: int = 0
    examples: list[Example] = Field(default_factory=list)

    @classmethod
    def merge(cls, parts: list[ParityFigures], k: int) -> ParityFigures:
        return cls(
            rows=sum(p.rows for p in parts),
            compared=sum(p.compared for p in parts),
            without=sum(p.without for p in parts),
            shards=sum(p.shards for p in parts),
            differ=sum(p.differ for p in parts),
            examples=[e for p in parts for e in p.examples][:k],
        )


class ToolFigures(BaseModel):
    """The tool-calls check's figures (regen.audit.checks.tool_calls): the model's calls in
    rows with tools."""

    model_config = ConfigDict(extra="forbid")

    rows: int = 0
    turns: int = 0
    calls: int = 0
    counted_blocks: bool = True
    """False where no tokenizer with a call token was at hand: dropped blocks not counted."""
    malformed: Hits = Field(default_factory=Hits)
    unknown: Hits = Field(default_factory=Hits)
    dropped: Hits = Field(default_factory=Hits)
    stopped: Hits = Field(default_factory=Hits)

    @classmethod
    def merge(cls, parts: list[ToolFigures], k: int) -> ToolFigures:
        def hits(name: str) -> Hits:
            found = [getattr(p, name) for p in parts]
            examples = [e for h in found for e in h.examples][:k]
            return Hits(n=sum(h.n for h in found), examples=examples)

        return cls(
            rows=sum(p.rows for p in parts),
            turns=sum(p.turns for p in parts),
            calls=sum(p.calls for p in parts),
            counted_blocks=all(p.counted_blocks for p in parts if p.rows),
            malformed=hits("malformed"),
            unknown=hits("unknown"),
            dropped=hits("dropped"),
            stopped=hits("stopped"),
        )


class Summary(BaseModel):
    """The audit's figures over some rows: one shard's, or many shards' merged."""

    model_config = ConfigDict(extra="forbid")

    settings: str
    max_examples: int
    sources: dict[int, str] = Field(default_factory=dict)
    """Shard -> the digest of the data it was computed from (its manifest's sha256)."""
    rows: int = 0
    """Conversations; completeness and errors count these, the answer checks count turns."""
    errors: Hits = Field(default_factory=Hits)
    finish_reasons: dict[str, int] = Field(default_factory=dict)
    completions: int = 0
    """Answered turns (error rows left out): the denominator of the answer checks."""
    flags: dict[str, Hits] = Field(default_factory=dict)
    empty_kinds: dict[str, int] = Field(default_factory=dict)
    tiny: dict[str, Hits] = Field(default_factory=dict)
    lengths: dict[str, dict[int, int]] = Field(default_factory=dict)
    """Column -> {length: completions}: exact quantiles and histograms after any merge."""
    answers: Answers = Field(default_factory=Answers)
    servers: dict[str, dict[str, int]] = Field(default_factory=dict)
    server_examples: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    thinking_completions: int = 0
    """Completions whose row asked for thinking: the denominator of the empty-thinking check."""
    by_setting: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Sampling setting (regen.audit.features.setting_label) -> rows, completions, defect
    counts and token sums, as `servers` per server."""
    setting_examples: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    loss: LossFigures = Field(default_factory=LossFigures)
    parity: ParityFigures = Field(default_factory=ParityFigures)
    tools: ToolFigures = Field(default_factory=ToolFigures)

    @property
    def shards(self) -> list[int]:
        return sorted(self.sources)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()
