"""Saved blocks named by a deployment's parameters, folded into the one `RegenConfig` of a run.

A deployment names blocks rather than carrying their values, so a token or an API key is never a
flow-run parameter (those are stored and shown in the UI); the values are loaded here, in the
flow's process, once at the top of the run.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from prefect.blocks.core import Block
from prefect.blocks.system import Secret
from pydantic import BaseModel, SecretStr

from blocks import FleetConfig, ModelSource
from regen.config import RegenConfig

B = TypeVar("B", bound=Block)


def load_block(kind: type[B], name: str) -> B:
    """`kind.load(name)` from sync code (the flow, and hooks, which run in a thread without a
    loop); `load`'s dispatch type also admits the coroutine it returns inside a loop."""
    return cast(B, kind.load(name))


class ResolvedRun(BaseModel):
    """The run's config with every named block applied, and the one secret staging needs."""

    config: RegenConfig
    hf_token: SecretStr | None = None


def _s3_bucket_url(name: str) -> str:
    from prefect_aws import S3Bucket

    bucket = load_block(S3Bucket, name)
    folder = str(bucket.bucket_folder or "").strip("/")
    return f"s3://{bucket.bucket_name}/{folder}" if folder else f"s3://{bucket.bucket_name}"


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

    The S3Bucket gives the dataset's location only: storage is opened from the `output` URL
    (once per run, `regen.run.OpenedRun`, and in the hooks), so its credentials come from the
    worker's environment.
    """
    data: dict[str, Any] = config.model_dump()
    hf_token = None
    if fleet_block:
        data["engine"] = load_block(FleetConfig, fleet_block).engine().model_dump()
    if model_block:
        source = load_block(ModelSource, model_block)
        data["model"] = source.model().model_dump()
        hf_token = source.hf_token
    if storage_block:
        data["output"] = _s3_bucket_url(storage_block)
    if api_key_secret:
        data["engine"]["api_key"] = SecretStr(str(load_block(Secret, api_key_secret).get()))
    return ResolvedRun(config=RegenConfig.model_validate(data), hf_token=hf_token)
