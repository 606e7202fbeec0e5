"""Saved blocks named by a deployment's parameters, folded into the one `RegenConfig` of a run.

A deployment names blocks rather than carrying their values, so a token or an API key is never a
flow-run parameter (those are stored and shown in the UI); the values are loaded here, in the
flow's process, once at the top of the run.
"""

from __future__ import annotations

from typing import Any

from prefect.blocks.system import Secret
from pydantic import BaseModel, ConfigDict, SecretStr

from blocks import FleetConfig, ModelSource, load_block
from regen.config import RegenConfig
from regen.storage import Storage


class ResolvedRun(BaseModel):
    """The run's config with every named block applied, the one secret staging needs, and the
    storage an `S3Bucket` block opened with its own credentials (None: open `config.output`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    config: RegenConfig
    hf_token: SecretStr | None = None
    storage: Storage | None = None


def resolve_config(
    config: RegenConfig,
    *,
    fleet_block: str | None = None,
    model_block: str | None = None,
    storage_block: str | None = None,
    api_key_secret: str | None = None,
) -> ResolvedRun:
    """`config` with `engine` from a `FleetConfig`, `model` from a `ModelSource`, `output` from
    an `S3Bucket` and `engine.api_key` from a `Secret`, each only when its name is given.

    The S3Bucket's storage carries the block's credentials; a stage that opens the output from
    its URL instead gets the worker's environment (the AWS default chain).
    """
    data: dict[str, Any] = config.model_dump()
    hf_token = None
    storage = None
    if fleet_block:
        data["engine"] = load_block(FleetConfig, fleet_block).engine.model_dump()
    if model_block:
        source = load_block(ModelSource, model_block)
        data["model"] = source.model().model_dump()
        hf_token = source.hf_token
    if storage_block:
        from blocks.storage import open_s3_bucket_block  # prefect-aws and boto3: only if named

        storage = open_s3_bucket_block(storage_block)
        data["output"] = storage.uri
    if api_key_secret:
        data["engine"]["api_key"] = SecretStr(str(load_block(Secret, api_key_secret).get()))
    return ResolvedRun(config=RegenConfig.model_validate(data), hf_token=hf_token, storage=storage)
