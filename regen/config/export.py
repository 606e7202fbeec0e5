"""The `export:` section: a trainer's format and the filters on what goes into an export.

The exporter itself is `regen.export`; `Turns` is defined here because the loss mask
(`regen.lossmask`) takes the same choice the section offers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Turns = Literal["last", "each"]
"""Which assistant turns of a conversation a token export trains on: the last, or each."""

ExportFormat = Literal["specforge", "tokenized", "hf-dataset", "messages"]
"""specforge: SpecForge's `conversations` JSONL; tokenized: `input_ids` + `loss_mask` JSONL
(SpecForge's pre-tokenized input); hf-dataset: an Arrow dataset of `input_ids`, `loss_mask`,
`seq_len` (vLLM speculators' prepared form); messages: `{"id", "messages"}` JSONL (TensorRT
Model Optimizer)."""

FORMATS: tuple[ExportFormat, ...] = ("specforge", "tokenized", "hf-dataset", "messages")
TOKEN_FORMATS: frozenset[str] = frozenset({"tokenized", "hf-dataset"})


class ExportOptions(BaseModel):
    """One export: part of its record (.regen-export), so a rerun with other options rewrites
    every file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: ExportFormat
    turns: Turns = Field(
        default="each",
        description="Token formats: one sample per assistant turn (each) or the last turn only.",
    )
    exclude_truncated: bool = Field(
        default=False, description="Leave out answers cut at max_tokens (finish_reason length)."
    )
    min_loss_tokens: int = Field(
        default=0, ge=0, description="Leave out samples with fewer trained (response) tokens."
    )
    generated_only: bool | None = Field(
        default=None,
        description="Conversation formats: drop the assistant turns that came with the input "
        "(a `turns: last` dataset's earlier answers), so a trainer trains only the target "
        "model's answers. None: on for `turns: last` datasets, off otherwise (.regen-export "
        "records what was used). Token formats train the generated turns only anyway.",
    )
    single_file: bool = Field(
        default=False,
        description="JSONL formats: one `<format>.jsonl` (SpecForge opens one file) instead of "
        "a file per shard; rewritten whole when any shard changed.",
    )
    token_freq: bool = Field(
        default=False,
        description="Token formats: also write token_freq.pt, speculators' token frequency "
        "distribution of the trained tokens (a draft's reduced vocabulary is built from it).",
    )

    @model_validator(mode="after")
    def _fits_format(self) -> ExportOptions:
        if self.single_file and self.format == "hf-dataset":
            raise ValueError("single_file: hf-dataset is an Arrow directory, not JSONL")
        if self.token_freq and self.format not in TOKEN_FORMATS:
            raise ValueError("token_freq: only the token formats (tokenized, hf-dataset)")
        return self


class ExportConfig(BaseModel):
    """The `export:` section of a run: formats written after a passing audit.

    Each format goes to `<dest>/<format>/`, so one destination holds them all.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True)

    dest: str = Field(min_length=1, description="A directory or s3://bucket/prefix.")
    formats: list[ExportFormat] = Field(
        min_length=1, description="Formats to write: specforge, tokenized, hf-dataset, messages."
    )
    turns: Turns = Field(
        default="each",
        description="Token formats: one sample per assistant turn (each) or the last turn only.",
    )
    exclude_truncated: bool = Field(
        default=False, description="Leave out answers cut at max_tokens (finish_reason length)."
    )
    min_loss_tokens: int = Field(
        default=0, ge=0, description="Leave out samples with fewer trained (response) tokens."
    )
    generated_only: bool | None = Field(
        default=None,
        description="Conversation formats: leave out the assistant turns that came with the "
        "input; default on for turns: last datasets, off otherwise.",
    )
    single_file: bool = Field(
        default=False,
        description="JSONL formats: one <format>.jsonl (SpecForge opens one file) instead of "
        "a file per shard.",
    )
    token_freq: bool = Field(
        default=False,
        description="Token formats: also write token_freq.pt (speculators' token frequencies).",
    )

    def targets(self) -> list[tuple[str, ExportOptions]]:
        """(destination, options) per format, in the order given, each format once."""
        base = self.dest.rstrip("/")
        return [
            (
                f"{base}/{fmt}",
                ExportOptions(
                    format=fmt,
                    turns=self.turns,
                    exclude_truncated=self.exclude_truncated,
                    min_loss_tokens=self.min_loss_tokens,
                    generated_only=self.generated_only,
                    single_file=self.single_file and fmt != "hf-dataset",
                    token_freq=self.token_freq and fmt in TOKEN_FORMATS,
                ),
            )
            for fmt in dict.fromkeys(self.formats)
        ]
