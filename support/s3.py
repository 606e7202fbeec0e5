"""A real S3 API on loopback for tests: moto's threaded server, restartable for outage tests."""

from __future__ import annotations

import functools
import http.client
import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import boto3
from moto.server import ThreadedMotoServer

from regen.storage.s3 import RetryPolicy, S3Storage, client_config, new_session

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client  # boto3-stubs[s3], a dev dependency

KEY_ID = "testing"
SECRET = "testing"
REGION = "us-east-1"
_patched = False


def _atomic_conditional_puts() -> None:
    """Make moto's PutObject atomic, as S3's is.

    moto checks `If-None-Match: *` and then stores the object without a lock, so two racing
    conditional puts of one key can both succeed under load; S3 never lets both win, and the
    claims rest on that. One lock around moto's PutObject gives the tests S3's guarantee.
    """
    global _patched
    from moto.s3.responses import S3Response

    if _patched:
        return
    original = S3Response.put_object
    lock = threading.Lock()

    @functools.wraps(original)
    def put_object(self: S3Response) -> Any:
        with lock:
            return original(self)

    S3Response.put_object = put_object  # type: ignore[method-assign]
    _patched = True


class MotoS3:
    """One moto server; objects live in this process's moto backend, so they survive restarts."""

    def __init__(self, ip_address: str = "127.0.0.1") -> None:
        self.ip_address = ip_address
        self.port = 0
        self._server: ThreadedMotoServer | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.ip_address}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for code that uses the default credential chain (S3Storage.from_url)."""
        return {
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            # A developer's ~/.aws must not leak a profile or a real endpoint into a test.
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        }

    def start(self) -> None:
        """Start, on the port of the previous start if there was one (outage tests)."""
        _atomic_conditional_puts()
        server = ThreadedMotoServer(ip_address=self.ip_address, port=self.port, verbose=False)
        server.start()
        self.port = server.get_host_and_port()[1]
        self._server = server

    def stop(self) -> None:
        """Stop and close the socket, so clients are refused (not left hanging) meanwhile."""
        if self._server is None:
            return
        self._server.stop()
        # ThreadedMotoServer.stop() leaves the listening socket open: the kernel would accept
        # connections nobody serves, and the port could not be bound again by start().
        if self._server._server is not None:
            self._server._server.server_close()
        self._server = None

    def client(self) -> S3Client:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            config=client_config(connect_timeout_s=2.0, read_timeout_s=10.0),
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
        )

    def counting_client(self, calls: list[str]) -> S3Client:
        """`client()`, noting each S3 call it sends (PutObject, HeadBucket...) in `calls`: a
        call retried shows as the same name again, whatever the machine's speed."""
        client = self.client()
        client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
        return client

    def create_bucket(self, prefix: str = "regen-test") -> str:
        """A new bucket with a unique name: tests share one moto backend per process."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def storage(self, bucket: str, prefix: str = "", retry: RetryPolicy | None = None) -> S3Storage:
        """An `S3Storage` on this server with explicit test credentials."""
        session = new_session(
            region_name=REGION, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET
        )
        config = client_config(connect_timeout_s=2.0, read_timeout_s=10.0)

        def factory() -> S3Client:
            return session.client("s3", endpoint_url=self.endpoint_url, config=config)

        return S3Storage(bucket, prefix, factory, session=session, retry=retry)


@contextmanager
def moto_server(ip_address: str = "127.0.0.1") -> Iterator[MotoS3]:
    """A started moto S3 server on a free port, stopped on exit."""
    # werkzeug logs every request at INFO; a test's output should show only what failed.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = MotoS3(ip_address)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class _ForgetfulHandler(BaseHTTPRequestHandler):
    """Forwards each request to the server behind, less its `If-None-Match` header."""

    server: _ForgetfulServer
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() != "if-none-match"}
        upstream = http.client.HTTPConnection(self.server.behind, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in {"transfer-encoding", "connection", "content-length"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ForgetfulServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, behind: str) -> None:
        super().__init__(("127.0.0.1", 0), _ForgetfulHandler)
        self.behind = behind


@contextmanager
def ignoring_if_none_match(moto: MotoS3) -> Iterator[MotoS3]:
    """An S3 endpoint on loopback that ignores `If-None-Match` as some S3 stand-ins do (an old
    MinIO or Ceph, a caching gateway): real HTTP in front of `moto`, dropping that header, so a
    conditional PUT of an existing key overwrites it. The same buckets as `moto`; stopped on
    exit."""
    server = _ForgetfulServer(urlsplit(moto.endpoint_url).netloc)
    thread = threading.Thread(target=server.serve_forever, name="forgetful-s3", daemon=True)
    thread.start()
    front = MotoS3(moto.ip_address)
    front.port = server.server_address[1]
    try:
        yield front
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
