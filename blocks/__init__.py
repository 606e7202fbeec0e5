"""Prefect blocks that hold regen's saved configuration (`regen blocks register`)."""

from __future__ import annotations

from typing import TypeVar, cast

from prefect.blocks.core import Block

from blocks.fleet_config import FleetConfig
from blocks.model_source import ModelSource
from regen.errors import UsageError, UserError

__all__ = ["FleetConfig", "ModelSource", "load_block", "register_blocks", "require_api"]

B = TypeVar("B", bound=Block)


def load_block(kind: type[B], name: str) -> B:
    """`kind.load(name)` from sync code (the flow, and hooks, which run in a thread without a
    loop); `load`'s dispatch type also admits the coroutine it returns inside a loop."""
    return cast(B, kind.load(name))


def require_api() -> str:
    """The Prefect API blocks are saved to, answering its health check.

    Without PREFECT_API_URL, Prefect starts a temporary server for the command and drops it
    (and whatever was registered) when the command ends: a registration that reports success
    and leaves nothing behind. So no URL is a usage error (exit 2), a dead one a failure (1).
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise UsageError(
            "PREFECT_API_URL is not set: blocks would be registered in a temporary server "
            "that is gone when this command ends; start a server and export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    with get_client(sync_client=True) as client:
        failed = client.api_healthcheck()
    if failed is not None:
        raise UserError(f"PREFECT_API_URL {url} is not reachable ({failed}): start the server")
    return str(url)


def register_blocks() -> list[str]:
    """Register regen's block types (and prefect-aws's) with the current Prefect API."""
    from prefect_aws import AwsCredentials, S3Bucket

    names = []
    for block in (FleetConfig, ModelSource, AwsCredentials, S3Bucket):
        block.register_type_and_schema()
        names.append(block.get_block_type_slug())
    return names
