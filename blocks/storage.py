"""A saved prefect-aws `S3Bucket` block as the dataset's `Storage`, with the block's credentials.

The credentials stay inside the storage object (its boto3 session): never a flow parameter,
a log line or a command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_aws import S3Bucket

from blocks import load_block
from regen.storage.s3 import RetryPolicy, S3Storage, client_config

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # boto3-stubs[s3], a dev dependency


def storage_from_s3_bucket_block(block: S3Bucket, retry: RetryPolicy | None = None) -> S3Storage:
    """`S3Storage` over the block's bucket, folder, credentials and client parameters.

    The client comes from the block's boto3 session rather than `get_s3_client()`: that one is
    cached with botocore's retries on, and `S3Storage` must own retries to bound an outage.
    """
    credentials = block.credentials
    session = credentials.get_boto3_session()
    params = credentials.aws_client_parameters.get_params_override()
    saved = params.pop("config", None)
    # Our retry and timeout settings win; anything else the block's config says is kept.
    config = saved.merge(client_config()) if saved is not None else client_config()
    if credentials.region_name is not None:
        params["region_name"] = credentials.region_name

    def factory() -> S3Client:
        return session.client("s3", config=config, **params)

    return S3Storage(block.bucket_name, block.bucket_folder, factory, session=session, retry=retry)


def open_s3_bucket_block(name: str, retry: RetryPolicy | None = None) -> S3Storage:
    """The storage a saved `S3Bucket` block names; its `uri` is the dataset's URL."""
    return storage_from_s3_bucket_block(load_block(S3Bucket, name), retry)
