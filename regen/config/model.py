"""Where the weights come from and under which name the servers serve them."""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    Field,
)

from regen.config.section import Section


class ModelConfig(Section):
    """Where the weights come from and under which name the servers serve them."""

    source: str = Field(description="Local directory, s3://bucket/prefix, or hf://org/repo.")
    revision: str | None = Field(default=None, description="HF revision or S3 version tag.")
    served_name: str = Field(
        min_length=1,
        description="--served-model-name of every server, and the model of every request.",
    )
    stage_dir: Path | None = Field(
        default=None,
        description="Where the model is staged (a RAM disk); default /dev/shm/regen-models/<name>.",
    )
    stage: bool = Field(
        default=True,
        description="Copy the model to stage_dir before launch; false: the servers load "
        "model.source directly.",
    )
    tokenizer_path: Path | None = Field(
        default=None,
        description="Model directory (tokenizer.json, chat template) the audit renders turns "
        "without token ids with, and checks stored prompts against (template parity); default "
        "the model directory on this machine, else a remote source's tokenizer files fetched "
        "into work_dir/tokenizer/.",
    )

    def staged_path(self) -> Path:
        """The directory the servers load from."""
        if not self.stage:
            return Path(self.source)
        return self.stage_dir or Path("/dev/shm/regen-models") / self.served_name
