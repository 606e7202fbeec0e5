"""A server the dispatcher can send requests to, whoever launched it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    """One SGLang (or emulator) server: its place in the fleet, its URL and its GPU."""

    index: int
    url: str
    gpu: int | None = None

    @property
    def name(self) -> str:
        return f"server-{self.index}"
