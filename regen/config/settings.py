"""`RegenConfig`: every section together, the flow's one parameter."""

from __future__ import annotations

from pathlib import Path

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
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

# Where the concurrency tuner starts each server: the fixed default regen used before it
# measured, so a run is never slower than it was while the first measurements come in.
START_CONCURRENCY = 64


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
        description="Requests kept in flight on every server, fixed. Default: measured per "
        "server while it generates, from 64 up to the server's own max_running_requests "
        "and engine.max_running_requests.",
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

    @model_validator(mode="after")
    def _seeded_sampling(self) -> RegenConfig:
        # sglang 0.5.23 asserts in its sampler (sampler.py, top_k_top_p_min_p_sampling_from_
        # probs_torch) when a seeded batch asks for min_p: the scheduler would die mid-run.
        if self.engine.deterministic:
            min_ps = [self.sampling.min_p] + [s.min_p or 0.0 for s in self.sampling.mix]
            if any(min_ps):
                raise ValueError(
                    "engine.deterministic: SGLang's seeded sampler takes no min_p; set "
                    "sampling.min_p (and every sampling.mix entry's) to 0"
                )
        return self

    @property
    def concurrency(self) -> int:
        """Requests in flight per server at the start: the fixed number, else where the
        tuner starts (today's fixed default, below any cap)."""
        if self.concurrency_per_server is not None:
            return self.concurrency_per_server
        cap = self.engine.max_running_requests
        return START_CONCURRENCY if cap is None else min(cap, START_CONCURRENCY)

    @property
    def tuned(self) -> bool:
        """Whether each server's concurrency is measured (no fixed concurrency_per_server)."""
        return self.concurrency_per_server is None
