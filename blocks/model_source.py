"""`ModelSource`: where a model's weights come from (HF repo, S3 prefix or local path)."""

from __future__ import annotations

from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from regen.config import ModelConfig


class ModelSource(Block):
    """A model and its revision; `hf_token` is kept as a secret, never shown in the UI."""

    _block_type_name = "regen-model-source"
    _description = "A target model for regen: hf://org/repo, s3://bucket/prefix or a directory."

    source: str
    served_name: str
    revision: str | None = None
    stage_dir: Path | None = None
    hf_token: SecretStr | None = Field(default=None, description="Token for gated HF repos.")

    def model(self) -> ModelConfig:
        return ModelConfig(
            source=self.source,
            served_name=self.served_name,
            revision=self.revision,
            stage_dir=self.stage_dir,
        )
