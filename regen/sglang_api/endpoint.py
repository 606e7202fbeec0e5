"""A server the dispatcher can send requests to, whoever launched it, and its URLs."""

from __future__ import annotations

from dataclasses import dataclass

CHAT_PATH = "/v1/chat/completions"
ABORT_PATH = "/abort_request"


@dataclass(frozen=True)
class Endpoint:
    """One SGLang (or emulator) server: its place in the fleet, its URL and its GPU."""

    index: int
    url: str
    gpu: int | None = None

    @property
    def name(self) -> str:
        return f"server-{self.index}"

    def url_of(self, path: str) -> str:
        """The server's URL for `path` (/health, /v1/models, /server_info, /metrics...)."""
        return f"{self.url.rstrip('/')}{path}"

    @property
    def chat_url(self) -> str:
        return self.url_of(CHAT_PATH)

    @property
    def abort_url(self) -> str:
        """POST {"rid": ...}: SGLang aborts the requests whose rid starts with it."""
        return self.url_of(ABORT_PATH)
