"""Saved blocks named by a deployment's parameters, folded into the one `RegenConfig` of a run.

A deployment names blocks rather than carrying their values, so a token or an API key is never a
flow-run parameter (those are stored and shown in the UI); the values are loaded here, in the
flow's process, once at the top of the run.
"""

from __future__ import annotations

import json
from typing import Any

from prefect.blocks.system import Secret
from pydantic import SecretStr

from blocks import FleetConfig, ModelSource, load_block
from regen.config import RegenConfig, parse_config
from regen.run import OpenedRun


def config_parameter(parameters: dict[str, Any]) -> RegenConfig | None:
    """A flow run's `config` parameter as a `RegenConfig` (None: the run has none): what its
    name and its state hooks read, which get the parameters rather than the flow's locals."""
    raw = parameters.get("config")
    if raw is None or isinstance(raw, RegenConfig):
        return raw
    # A deployment's parameters arrive as JSON-ready values; a hook's may hold paths.
    return parse_config(raw if isinstance(raw, dict) else json.loads(json.dumps(raw, default=str)))


def open_run(
    config: RegenConfig,
    *,
    fleet_block: str | None = None,
    model_block: str | None = None,
    storage_block: str | None = None,
    api_key_secret: str | None = None,
) -> OpenedRun:
    """The run of `config` with `engine` from a `FleetConfig`, `model` from a `ModelSource`,
    `output` from an `S3Bucket` and `engine.api_key` from a `Secret`, each only when its name
    is given.

    The S3Bucket's storage carries the block's credentials; a stage that opened the output from
    its URL instead would get the worker's environment (the AWS default chain).
    """
    data: dict[str, Any] = config.model_dump()
    hf_token = None
    storage = None
    key_from = None  # named by a 401, so the user knows which key to fix
    if fleet_block:
        data["engine"] = load_block(FleetConfig, fleet_block).engine.model_dump()
        if data["engine"].get("api_key") is not None:
            key_from = f"engine.api_key of the FleetConfig block {fleet_block!r}"
    if model_block:
        source = load_block(ModelSource, model_block)
        data["model"] = source.model().model_dump()
        hf_token = source.hf_token.get_secret_value() if source.hf_token else None
    if storage_block:
        from blocks.storage import open_s3_bucket_block  # prefect-aws and boto3: only if named

        storage = open_s3_bucket_block(storage_block)
        data["output"] = storage.uri
    if api_key_secret:
        data["engine"]["api_key"] = SecretStr(str(load_block(Secret, api_key_secret).get()))
        key_from = f"the Secret block {api_key_secret!r} that api_key_secret names"
    return OpenedRun(
        RegenConfig.model_validate(data), opened=storage, hf_token=hf_token, key_from=key_from
    )
