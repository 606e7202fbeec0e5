"""A webhook receiver on loopback: a real HTTP server that keeps every JSON body POSTed to it,
for the tests that check what a notification block sends (Prefect's custom webhook)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """The messages received so far, in order; `wait_for` blocks on their count."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self.url = ""

    def add(self, message: dict[str, Any]) -> None:
        with self._changed:
            self.messages.append(message)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float) -> list[dict[str, Any]]:
        """The messages once there are `count` of them, or as they are when `timeout` ran out
        (the caller's assertion says what was missing)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.messages) >= count, timeout)
            return list(self.messages)


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    """A started receiver on a free port (`url`), stopped on exit."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                receiver.add(json.loads(body))
            except ValueError:
                receiver.add({"raw": body.decode(errors="replace")})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
