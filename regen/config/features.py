"""The `features:` section: the target's hidden states for offline draft training.

The stage itself is `regen.features`; this section only says which layers, in which dtype,
of which samples, and where they go.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from regen.config.export import Turns
from regen.config.section import Section

Convention = Literal["eagle3", "dflash", "dspark"]
"""SGLang's aux-capture conventions (`--speculative-algorithm EAGLE3|DFLASH|DSPARK` under
`--enable-return-aux-hidden-states`): EAGLE-3 has default layers, the others need ids."""

FeatureDtype = Literal["bf16", "fp8"]
"""bf16: the values as the model computes them, rounded to bf16; fp8: e4m3 with one float32
scale per token (speculators' FP8 layout), half the bytes."""


class FeaturesConfig(Section):
    """Capture the target's hidden states over the dataset's stored token ids (stage 7)."""

    convention: Convention = Field(
        default="eagle3",
        description="Which draft family the layers are for: eagle3 (SGLang's default layers "
        "2, n/2 and n-3 of an n-layer target, as SpecForge and speculators take them), "
        "dflash or dspark (layer_ids required).",
    )
    layer_ids: list[int] | None = Field(
        default=None,
        description="Target layer ids whose outputs are captured (SGLang's "
        "--return-aux-hidden-state-layer-ids: the output of layer k, k from 0); required for "
        "dflash and dspark, optional for eagle3.",
    )
    dtype: FeatureDtype = Field(
        default="bf16", description="bf16, or fp8 (e4m3 + a float32 scale per token)."
    )
    turns: Turns = Field(
        default="each",
        description="One sample per assistant turn (each) or per conversation's last turn, "
        "as the token exports take them.",
    )
    dest: str | None = Field(
        default=None,
        description="Where the feature shards go (a directory or s3:// prefix); default "
        "`features/` under the dataset root.",
    )
    concurrency_per_server: int = Field(
        default=8, ge=1, description="Prefill requests in flight per server."
    )
    max_attempts: int = Field(
        default=3, ge=1, description="Tries per sample on a 5xx or a dead server."
    )

    @model_validator(mode="after")
    def _check(self) -> FeaturesConfig:
        ids = self.layer_ids
        if self.convention != "eagle3" and not ids:
            raise ValueError(f"features.convention {self.convention} needs features.layer_ids")
        if ids is not None:
            if not ids:
                raise ValueError("features.layer_ids must not be empty")
            if min(ids) < 0:
                raise ValueError(f"features.layer_ids must be >= 0, got {ids}")
            if len(set(ids)) != len(ids):
                raise ValueError(f"features.layer_ids lists a layer twice: {ids}")
        return self
