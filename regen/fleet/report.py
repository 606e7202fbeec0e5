"""The fleet report: one row per server, written to `report/fleet.json` and shown as a table."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from regen.dataset.keys import FLEET_KEY
from regen.display.figures import NONE, markdown_table, sig
from regen.storage import Storage

ServerStatus = Literal["healthy", "exited", "timed_out", "unhealthy", "relaunching", "out"]
"""How a server came up (the first four), or where its relaunches left it: `relaunching`, or
`out` for the rest of the run once they could not bring it back."""


class Relaunch(BaseModel):
    """One start of a server again during generation: why, what its log said, and when it
    rejoined (the figure a heal is measured by)."""

    model_config = ConfigDict(frozen=True)

    cause: str = Field(
        description="When and why, in one line: its exit code and its log's last words, or "
        "the hang (`Cause.line`)."
    )
    log: str = Field(description="The server's log, appended at every start.")
    log_tail: str = Field(
        default="", description="The log's last lines when it went down, redacted; the run's "
        "log has one line a relaunch, this keeps the rest."
    )  # fmt: skip
    down_at: float = Field(description="Unix time the supervisor found it down.")
    back_at: float | None = Field(
        default=None,
        description="Unix time it rejoined the dispatcher; None while it is coming back, or "
        "when this start did not bring it back.",
    )


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
    max_running_requests: int | None = None
    """The server's own running cap (/server_info), the most regen keeps in flight on it."""
    kv_tokens: int | None = None
    """The server's KV pool in tokens (max_total_num_tokens)."""
    concurrency: int | None = None
    """Requests regen kept in flight on it: its measured best (or the fixed setting), written
    when generation ends."""
    relaunch_log: tuple[Relaunch, ...] = ()
    """Each start again during generation (`engine.relaunch`), in order."""
    cut_answers: int = 0
    """Answers it cut short (finish_reason abort) during generation: retried elsewhere, never
    stored; many from one server say it is overloaded or failing."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def relaunches(self) -> int:
        """Times it was started again during generation."""
        return len(self.relaunch_log)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def relaunch_causes(self) -> tuple[str, ...]:
        """Why, one line each: when, and its exit code with its log's last words, or the hang."""
        return tuple(r.cause for r in self.relaunch_log)

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
        if self.max_running_requests is not None:
            parts.append(f"max_running={self.max_running_requests}")
        if self.kv_tokens is not None:
            parts.append(f"kv_tokens={self.kv_tokens}")
        if self.flagged:
            parts.append("FLAGGED")
        if self.relaunches:
            parts.append(f"relaunched={self.relaunches}")
        if self.cut_answers:
            parts.append(f"cut={self.cut_answers}")
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


def with_cut_answers(rows: list[FleetRow], cut: Mapping[str, int]) -> list[FleetRow]:
    """`rows` with each server's count of cut answers (the dispatcher's, by server name)."""
    return [r.model_copy(update={"cut_answers": cut.get(r.server, r.cut_answers)}) for r in rows]


def write_fleet_report(storage: Storage, rows: list[FleetRow]) -> None:
    """Beside the audit's report, so a dataset records the fleet that made it."""
    data = [r.model_dump(mode="json") for r in rows]
    storage.write_bytes(FLEET_KEY, json.dumps(data, indent=2).encode())


def read_fleet_report(storage: Storage) -> list[FleetRow] | None:
    """The fleet that made a dataset (`report/fleet.json`), None when it has none."""
    try:
        data = json.loads(storage.read_bytes(FLEET_KEY))
    except FileNotFoundError:
        return None
    return [FleetRow.model_validate(row) for row in data]


def fleet_markdown(rows: list[FleetRow]) -> str:
    """The fleet as a table narrow enough for a ~1000 px pane: no URL (the servers are gone
    by the time anyone reads it), figures to 3 significant digits, reasons below the table.

    `probe tok/s` is the micro-benchmark's short fixed load at startup, not the run's speed.
    """
    healthy = sum(r.status == "healthy" for r in rows)
    flagged = [r for r in rows if r.flagged]
    lines = [
        f"**{healthy} / {len(rows)} servers healthy**"
        + (f", {len(flagged)} flagged slow" if flagged else ""),
        "",
        *markdown_table(
            [
                "server",
                "GPU",
                "port",
                "status",
                "startup",
                "probe latency",
                "probe tok/s",
                "accept length",
                "concurrency",
            ],
            (
                (
                    r.server,
                    _cell(r.gpu),
                    _cell(r.port),
                    _status(r),
                    _secs(r.startup_s),
                    _secs(r.probe_latency_s),
                    sig(r.tok_s),
                    sig(r.accept_length),
                    _concurrency(r),
                )
                for r in rows
            ),
            numeric={"GPU", "port", "startup", "probe latency", "probe tok/s", "accept length"},
        ),
    ]
    reasons = [r for r in rows if r.reason]
    if reasons:
        lines += ["", "Notes:", ""]
        lines += [f"- {r.server}: {r.reason.splitlines()[0]}" for r in reasons]
    relaunched = [r for r in rows if r.relaunch_causes]
    if relaunched:
        lines += ["", "Relaunched:", ""]
        lines += [f"- {r.server}: {cause}" for r in relaunched for cause in r.relaunch_causes]
    if cut := [r for r in rows if r.cut_answers]:
        lines += ["", "Answers cut short (finish_reason abort; retried, never stored):", ""]
        lines += [f"- {r.server}: {r.cut_answers:,}" for r in cut]
    lines += ["", "`probe tok/s`: each server's micro-benchmark at startup (`engine.bench`)."]
    lines += [
        "`concurrency`: requests regen kept in flight on the server (measured per server "
        "unless `concurrency_per_server` fixes it) / the server's own max running requests."
    ]
    return "\n".join(lines) + "\n"


def _concurrency(r: FleetRow) -> str:
    """`chosen / server cap`, either part `–` while unknown."""
    if r.concurrency is None and r.max_running_requests is None:
        return NONE
    return f"{_cell(r.concurrency)} / {_cell(r.max_running_requests)}"


def _status(r: FleetRow) -> str:
    if r.flagged:
        return f"**SLOW** ({r.status})"
    return r.status if r.status == "healthy" else f"**{r.status.upper()}**"


def _cell(value: int | None) -> str:
    return NONE if value is None else str(value)


def _secs(value: float | None) -> str:
    return NONE if value is None else f"{sig(value)} s"
