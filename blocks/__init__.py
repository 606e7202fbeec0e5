"""Prefect blocks that hold regen's saved configuration (`regen blocks register`)."""

from __future__ import annotations

from blocks.fleet_config import FleetConfig
from blocks.model_source import ModelSource

__all__ = ["FleetConfig", "ModelSource", "register_blocks"]


def register_blocks() -> list[str]:
    """Register regen's block types (and prefect-aws's) with the current Prefect API."""
    from prefect_aws import AwsCredentials, S3Bucket

    names = []
    for block in (FleetConfig, ModelSource, AwsCredentials, S3Bucket):
        block.register_type_and_schema()
        names.append(block.get_block_type_slug())
    return names
