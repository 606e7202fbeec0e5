"""Prefect blocks that hold regen's saved configuration (`regen blocks register`)."""

from __future__ import annotations

from typing import TypeVar, cast

from prefect.blocks.core import Block

from blocks.fleet_config import FleetConfig
from blocks.model_source import ModelSource

__all__ = ["FleetConfig", "ModelSource", "load_block", "register_blocks"]

B = TypeVar("B", bound=Block)


def load_block(kind: type[B], name: str) -> B:
    """`kind.load(name)` from sync code (the flow, and hooks, which run in a thread without a
    loop); `load`'s dispatch type also admits the coroutine it returns inside a loop."""
    return cast(B, kind.load(name))


def register_blocks() -> list[str]:
    """Register regen's block types (and prefect-aws's) with the current Prefect API."""
    from prefect_aws import AwsCredentials, S3Bucket

    names = []
    for block in (FleetConfig, ModelSource, AwsCredentials, S3Bucket):
        block.register_type_and_schema()
        names.append(block.get_block_type_slug())
    return names
