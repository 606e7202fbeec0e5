"""The fleet report: one row per server, written to `report/fleet.json` and shown as a table."""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict

ServerStatus = Literal["healthy", "exited", "timed_out", "unhealthy"]


class FleetRow(BaseModel):
    """How one server came up and how fast it is; `flagged` marks a GPU far below the others."""

    model_config = ConfigDict(frozen=True)

    server: str
    gpu: int | None
    port: int | None
    url: str
    status: ServerStatus
    reason: str = ""
    startup_s: float | None = None
    probe_latency_s: float | None = None
    tok_s: float | None = None
    first_response_s: float | None = None
    accept_length: float | None = None
    flagged: bool = False

    def summary(self) -> str:
        """One log line; numbers left out until measured."""
        parts = [f"{self.server} gpu={self.gpu} port={self.port} {self.status}"]
        for label, value, unit in (
            ("startup", self.startup_s, "s"),
            ("probe", self.probe_latency_s, "s"),
            ("speed", self.tok_s, " tok/s"),
            ("accept", self.accept_length, ""),
        ):
            if value is not None:
                parts.append(f"{label}={value:.2f}{unit}")
        if self.flagged:
            parts.append("FLAGGED")
        if self.reason:
            parts.append(f"({self.reason.splitlines()[0]})")
        return " ".join(parts)


def flag_slow(rows: list[FleetRow], min_relative_speed: float) -> list[FleetRow]:
    """Flag servers slower than `min_relative_speed` x the median of the measured ones."""
    speeds = [r.tok_s for r in rows if r.tok_s is not None]
    if not speeds:
        return rows
    median = statistics.median(speeds)
    out = []
    for row in rows:
        slow = row.tok_s is not None and row.tok_s < min_relative_speed * median
        reason = row.reason
        if slow:
            reason = f"{row.tok_s:.0f} tok/s is below {min_relative_speed:g} x median {median:.0f}"
        out.append(row.model_copy(update={"flagged": slow, "reason": reason}))
    return out
