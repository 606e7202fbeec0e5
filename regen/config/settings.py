"""`RegenConfig`: every section together, the flow's one parameter."""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
)

from regen.config.audit import AuditConfig
from regen.config.engine import EngineConfig
from regen.config.export import ExportConfig
from regen.config.features import FeaturesConfig
from regen.config.generation import GenerationConfig
from regen.config.input import InputConfig
from regen.config.model import ModelConfig
from regen.config.sampling import RegenerationConfig, SamplingConfig
from regen.config.section import Section
from regen.config.uris import HubUri
from regen.errors import ConfigError


class RegenConfig(Section):
    """Everything a run needs; the Prefect flow takes it as its parameter (a form in the UI)."""

    model: ModelConfig = Field(description="The target model: its weights, name and staging.")
    engine: EngineConfig = Field(
        default=EngineConfig(), description="The fleet of servers: how they are launched."
    )
    prompts: str = Field(
        description="JSONL or Parquet file, glob or prefix, local or s3://, or a Hub dataset "
        "hf://datasets/ORG/NAME[@REVISION][/PATH-OR-GLOB]."
    )
    input: InputConfig = Field(
        default=InputConfig(), description="How the prompt set is read, and a changed one treated."
    )
    output: str = Field(description="Dataset root: a directory or an s3://bucket/prefix.")
    work_dir: Path = Field(
        default=Path(".regen"),
        description="Local files of each run (server logs, PID files, key files, under "
        "runs/<flow run id>/), the prompt cache and rehearsals' datasets.",
    )
    sampling: SamplingConfig = Field(
        default=SamplingConfig(), description="The sampling parameters of every request."
    )
    regeneration: RegenerationConfig = Field(
        default=RegenerationConfig(),
        description="Which assistant turns are regenerated, and what becomes of the thinking.",
    )
    shard_size: int = Field(
        default=500, gt=0, description="Prompts per shard: the unit of commit, resume and retry."
    )
    concurrency_per_server: int | None = Field(
        default=None,
        gt=0,
        description="Requests in flight per server; default engine.max_running_requests.",
    )
    generation: GenerationConfig = Field(
        default=GenerationConfig(), description="How requests are sent, retried and reported."
    )
    audit: AuditConfig = Field(
        default=AuditConfig(), description="The quality gates' thresholds and policy."
    )
    export: ExportConfig | None = Field(
        default=None, description="Trainer formats written after a passing audit (stage 6)."
    )
    features: FeaturesConfig | None = Field(
        default=None,
        description="The target's hidden states over the stored token ids, captured after a "
        "passing audit (stage 7, `regen features`).",
    )

    @field_validator("prompts", "output")
    @classmethod
    def _uri(cls, value: str, info: ValidationInfo) -> str:
        if value.startswith("s3://") and not value[len("s3://") :].split("/", 1)[0]:
            raise ValueError(f"{value!r} has no bucket name")
        if value.startswith("hf://") and info.field_name == "prompts":
            try:
                HubUri.parse(value)
            except ConfigError as err:
                raise ValueError(str(err)) from None
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @property
    def concurrency(self) -> int:
        return self.concurrency_per_server or self.engine.max_running_requests
