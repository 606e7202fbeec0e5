"""`FleetConfig`: a node's saved fleet settings, so a deployment names a block, not a YAML file."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, field_validator

from regen.config import EngineConfig


class FleetConfig(Block):
    """The engine section of a node's `RegenConfig`, saved whole: every setting the YAML file
    takes, validated by `EngineConfig` itself, so an unknown or mistyped key is an error when
    the block is made rather than a setting silently dropped."""

    _block_type_name = "regen-fleet-config"
    _description = "How regen launches SGLang servers on one node (one server per GPU)."

    engine: EngineConfig = Field(description="The engine section of a regen config.")

    @field_validator("engine")
    @classmethod
    def _names_its_python(cls, engine: EngineConfig) -> EngineConfig:
        # EngineConfig's default is the interpreter of the process that makes the block, which
        # is not the one that has sglang on the node that loads it.
        if "python" not in engine.model_fields_set:
            raise ValueError("engine.python: name the interpreter of the node's sglang venv")
        return engine
