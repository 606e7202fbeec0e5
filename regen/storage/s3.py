"""An S3 prefix as a `Storage`, with one retry layer that rides out an outage of bounded length.

botocore's own retries are switched off (`client_config`) so that a single deadline bounds how
long any call may wait for S3 to come back; permanent failures (no bucket, no access) are not
retried and become a one-line `UserError` naming the bucket.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

import boto3
import botocore.loaders
import botocore.session
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError
from pydantic import BaseModel, Field
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay

from regen.errors import UserError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # boto3-stubs[s3], a dev dependency

T = TypeVar("T")

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "BandwidthLimitExceeded",
    }
)
# What is retried: a transient ClientError (the others are turned into the caller's error
# first) and a connection that failed or broke.
_TRANSIENT_ERRORS = (ClientError, BotoConnectionError, HTTPClientError)
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
    }
)


class RetryPolicy(BaseModel):
    """How long a call keeps retrying transient failures before it gives up."""

    deadline_s: float = Field(default=60.0, gt=0, description="Total time one call may retry.")
    first_delay_s: float = Field(default=0.1, gt=0)
    max_delay_s: float = Field(default=5.0, gt=0)

    def delay(self, attempt: int) -> float:
        """Exponential backoff with jitter, so many writers do not retry in lockstep."""
        return min(self.max_delay_s, self.first_delay_s * 2**attempt) * random.uniform(0.5, 1.0)


@dataclass(frozen=True)
class S3Object:
    """One listed object; `key` is relative to the storage prefix."""

    key: str
    size: int
    etag: str


def client_config(connect_timeout_s: float = 5.0, read_timeout_s: float = 60.0) -> Config:
    """botocore settings for clients behind `S3Storage`: no hidden retries, short connects."""
    return Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        max_pool_connections=32,
    )


@functools.cache
def _shared_loader() -> botocore.loaders.Loader:
    """botocore's data loader, made once: its parsed model files never change."""
    return botocore.loaders.create_loader()


def new_session(**credentials: Any) -> boto3.Session:
    """A boto3 session that shares one botocore data loader with every other one here.

    A fresh session reads and parses botocore's S3 model files again (about 0.1 s a client,
    a sixth of that with the loader shared); those files do not change, and one session's
    clients already share the loader's parsed copies, so sessions can too. Each session keeps
    its own credentials, config and client-creation state."""
    core = botocore.session.get_session()
    core.register_component("data_loader", _shared_loader())
    return boto3.Session(botocore_session=core, **credentials)


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise UserError(f"{url}: not an S3 URL (expected s3://bucket/prefix)")
    return parsed.netloc, parsed.path.strip("/")


class S3Storage:
    """A dataset root under `s3://bucket/prefix`; every PutObject is atomic, so no temp keys."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        client_factory: Callable[[], S3Client],
        *,
        session: boto3.Session | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """`session` is only read for credentials to hand to polars; the client does the I/O."""
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.retry = retry or RetryPolicy()
        self._client_factory = client_factory
        self._session = session
        self._client_lock = threading.Lock()
        self._client_obj: S3Client | None = None

    @classmethod
    def from_url(
        cls, url: str, endpoint_url: str | None = None, retry: RetryPolicy | None = None
    ) -> S3Storage:
        """The default credential chain; botocore reads AWS_ENDPOINT_URL(_S3) when none given."""
        bucket, prefix = parse_s3_url(url)
        session = new_session()
        config = client_config()

        def factory() -> S3Client:
            return session.client("s3", endpoint_url=endpoint_url, config=config)

        return cls(bucket, prefix, factory, session=session, retry=retry)

    def _client(self) -> S3Client:
        # boto3 clients are thread-safe but creating them from one session is not.
        with self._client_lock:
            if self._client_obj is None:
                self._client_obj = self._client_factory()
            return self._client_obj

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, op: str, key: str, fn: Callable[[S3Client], T]) -> T:
        """`fn` with the client, transient failures retried until the policy's deadline."""

        def attempt() -> T:
            try:
                return fn(self._client())
            except NoCredentialsError as err:
                raise UserError(f"{self.uri}: no AWS credentials found") from err
            except ClientError as err:
                # Permanent failures leave here as the error the caller gets: not retried.
                if not _is_transient(err):
                    raise self._permanent(err, op, key) from err
                raise

        deadline = self.retry.deadline_s
        retrying = Retrying(
            retry=retry_if_exception_type(_TRANSIENT_ERRORS),
            stop=stop_after_delay(deadline),
            # The last sleep ends at the deadline, so one more try comes right at it.
            wait=lambda state: min(
                self.retry.delay(state.attempt_number - 1),
                deadline - (state.seconds_since_start or 0.0),
            ),
        )
        try:
            return retrying(attempt)
        except RetryError as gave_up:
            last = gave_up.last_attempt.exception()
            raise UserError(
                f"s3://{self.bucket}: {op} failed for {deadline:g} s "
                f"({type(last).__name__}); is {self._client().meta.endpoint_url} reachable?"
            ) from last

    def _permanent(self, err: ClientError, op: str, key: str) -> Exception:
        code = str(err.response.get("Error", {}).get("Code", ""))
        if code in {"NoSuchKey", "404"} and op != "head_bucket":
            return FileNotFoundError(f"{self.uri}/{key}")
        if code in _MISSING_BUCKET_CODES or (code == "404" and op == "head_bucket"):
            return UserError(f"s3://{self.bucket}: bucket does not exist")
        if code in _DENIED_CODES:
            return UserError(
                f"s3://{self.bucket}: access denied ({code} on {op}); check credentials"
            )
        message = err.response.get("Error", {}).get("Message", "")
        return UserError(f"s3://{self.bucket}/{self._key(key)}: {op} failed: {code} {message}")

    def write_bytes(self, key: str, data: bytes) -> None:
        full = self._key(key)
        self._call(
            "put_object", key, lambda c: c.put_object(Bucket=self.bucket, Key=full, Body=data)
        )

    def create_exclusive(self, key: str, data: bytes) -> bool:
        full = self._key(key)
        attempts = 0

        def put(c: S3Client) -> bool:
            nonlocal attempts
            attempts += 1
            try:
                c.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                if code not in {"PreconditionFailed", "ConditionalRequestConflict"}:
                    raise
                # A retry after a lost response meets our own object: it is ours if the bytes
                # are (claims carry node and expiry, so another writer's bytes differ).
                if attempts > 1 and code == "PreconditionFailed":
                    got = c.get_object(Bucket=self.bucket, Key=full)["Body"].read()
                    return bool(got == data)
                return False
            return True

        return self._call("put_object", key, put)

    def read_bytes(self, key: str) -> bytes:
        full = self._key(key)

        # The body is read inside the retried call: a connection reset mid-body is retried too.
        def get(c: S3Client) -> bytes:
            return c.get_object(Bucket=self.bucket, Key=full)["Body"].read()

        return self._call("get_object", key, get)

    def exists(self, key: str) -> bool:
        # A listing, not HeadObject: HEAD answers a bare 404 for a missing bucket and key alike.
        full = self._key(key)
        found = self._call(
            "list_objects_v2",
            key,
            lambda c: c.list_objects_v2(Bucket=self.bucket, Prefix=full, MaxKeys=1),
        )
        return any(item["Key"] == full for item in found.get("Contents", []))

    def list_objects(self, prefix: str = "") -> list[S3Object]:
        """Objects under `prefix` with size and ETag, sorted by key; hidden names skipped."""
        base = f"{self.prefix}/" if self.prefix else ""

        def listing(c: S3Client) -> list[S3Object]:
            pages = c.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix
            )
            return [
                S3Object(item["Key"][len(base) :], item["Size"], item["ETag"].strip('"'))
                for page in pages
                for item in page.get("Contents", [])
            ]

        objects = self._call("list_objects_v2", prefix, listing)
        # Same rule as LocalStorage: dot-names are scratch (probe objects), never dataset keys.
        visible = (o for o in objects if o.key and not o.key.rsplit("/", 1)[-1].startswith("."))
        return sorted(visible, key=lambda o: o.key)

    def list(self, prefix: str = "") -> list[str]:
        return [o.key for o in self.list_objects(prefix)]

    def delete(self, key: str) -> None:
        full = self._key(key)
        self._call("delete_object", key, lambda c: c.delete_object(Bucket=self.bucket, Key=full))

    def put_file(self, key: str, path: Path, transfer: TransferConfig | None = None) -> None:
        """Upload `path` from disk, in parts when large: the object appears whole once the
        upload completes, and a file past one PUT's 5 GB goes up too."""
        full = self._key(key)
        self._call(
            "put_object",
            key,
            lambda c: c.upload_file(str(path), self.bucket, full, Config=transfer),
        )

    def download(
        self,
        key: str,
        path: Path,
        transfer: TransferConfig | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Download one object to `path` with parallel ranged GETs (large model shards)."""
        full = self._key(key)
        self._call(
            "get_object",
            key,
            lambda c: c.download_file(
                self.bucket, full, str(path), Config=transfer, Callback=progress
            ),
        )

    def polars_path(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def polars_options(self) -> dict[str, Any]:
        """What polars' object store needs to reach the same endpoint with the same identity."""
        client = self._client()
        endpoint = client.meta.endpoint_url
        options: dict[str, Any] = {}
        if ".amazonaws.com" in endpoint:
            options["aws_region"] = self._bucket_region(client)
        else:
            options["aws_endpoint_url"] = endpoint
            options["aws_region"] = client.meta.region_name or "us-east-1"
            if endpoint.startswith("http://"):
                options["aws_allow_http"] = "true"
        credentials = self._session.get_credentials() if self._session else None
        if credentials is not None:
            frozen = credentials.get_frozen_credentials()
            options["aws_access_key_id"] = frozen.access_key
            options["aws_secret_access_key"] = frozen.secret_key
            if frozen.token:
                options["aws_session_token"] = frozen.token
        return options

    def _bucket_region(self, client: S3Client) -> str:
        # polars, unlike boto3, does not follow S3's region redirects: ask the bucket itself.
        try:
            head = self._call("head_bucket", "", lambda c: c.head_bucket(Bucket=self.bucket))
            headers = head["ResponseMetadata"]["HTTPHeaders"]
        except UserError:
            return client.meta.region_name or "us-east-1"
        return str(headers.get("x-amz-bucket-region") or client.meta.region_name or "us-east-1")


def _is_transient(err: ClientError) -> bool:
    code = str(err.response.get("Error", {}).get("Code", ""))
    status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return code in _TRANSIENT_CODES or status >= 500 or status == 429
