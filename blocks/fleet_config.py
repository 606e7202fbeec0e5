"""`FleetConfig`: a node's saved fleet settings, so a deployment names a block, not a YAML file."""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from regen.config import EngineConfig


class FleetConfig(Block):
    """The engine section of a node: GPUs, ports, interpreter, speculative settings, extra args."""

    _block_type_name = "regen-fleet-config"
    _description = "How regen launches SGLang servers on one node (one server per GPU)."

    kind: str = "sglang"
    python: str = Field(description="Interpreter of the venv that has sglang.")
    gpus: list[int] = Field(default_factory=lambda: [0])
    base_port: int = 30000
    host: str = "127.0.0.1"
    reasoning_parser: str | None = "qwen3"
    speculative: dict[str, Any] = Field(default_factory=dict)
    max_running_requests: int = 64
    context_length: int = 40960
    mem_fraction_static: float = 0.88
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = 900.0
    api_key: SecretStr | None = None

    def engine(self) -> EngineConfig:
        """The validated `RegenConfig.engine` this block stands for."""
        data = self.model_dump(exclude={"api_key"}, exclude_none=True)
        data = {k: v for k, v in data.items() if k in EngineConfig.model_fields}
        if self.api_key is not None:
            data["api_key"] = self.api_key
        return EngineConfig.model_validate(data)
