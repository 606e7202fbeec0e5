"""`regen status OUTPUT`: a run at a glance from the dataset alone, from any shell or machine.

A plain `regen run` keeps its Prefect server to itself, so another shell (or a laptop reading
the bucket) has only what the run writes into its root: `progress.json` (rewritten every few
seconds: rows, rate, ETA, the rolling audit), the output's lease (`regen.storage.output_lease`: who
holds the root, and whether that holder is alive), the shards' manifests (what is committed),
and once it is over `report/stopped.json` and `report/audit.json`. No Prefect, no node access.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from regen.dataset.keys import (
    AUDIT_MARKDOWN_KEY,
    AUDIT_REPORT_KEY,
    NODES_PREFIX,
    RUN_KEY,
    key_url,
    parse_progress_key,
    progress_key,
)
from regen.display.figures import clock, compact, duration, pct, sig
from regen.display.progress import audit_line, quality
from regen.errors import UserError
from regen.progress.snapshot import ProgressSnapshot
from regen.storage import Storage
from regen.storage.lease import LeaseRecord
from regen.storage.output_lease import read_lease


class NoRun(UserError):
    """The output holds no run: nothing to show (exit 1)."""


@dataclass(frozen=True)
class RunStatus:
    """What the root says of its run at `now`; `progress` None before the first snapshot."""

    uri: str
    now: float
    run: dict[str, Any]
    progress: ProgressSnapshot | None
    state: str | None
    """How the run's process ended when it could not say more (`Cancelled`, `Crashed`)."""
    lease: LeaseRecord | None
    committed_shards: int
    committed_rows: int
    stopped: str | None
    audit: dict[str, Any] | None
    nodes: tuple[tuple[str, ProgressSnapshot], ...] = ()
    """A multi-node run's nodes, each with its own progress (`nodes/<node>.progress.json`)."""

    def lines(self) -> list[str]:
        """The status as `label: text` lines, the run's state first, figures after."""
        rows: list[tuple[str, str]] = [("output", self.uri), ("run", self._holder())]
        shards = self.run.get("num_shards")
        of = f" of {shards:,}" if isinstance(shards, int) else ""
        committed = (
            f"{self.committed_rows:,} rows committed in {self.committed_shards:,}{of} shards"
        )
        snap = self.progress
        if snap is None:
            # A multi-node run's progress is its nodes' (below); a single node's comes soon.
            where = "see each node" if self.nodes else "no progress.json yet"
            rows.append(("progress", f"{where}; {committed}"))
        else:
            rows.append(
                ("progress", f"{snap.done:,} / {snap.total:,} rows generated "
                             f"({pct(snap.fraction)}); {committed}")
            )  # fmt: skip
            rows.append(("speed", self._speed(snap)))
            rows.append(self._eta(snap))
            # The cards' word for it (`quality ok`), then the rolling audit's checks or the stop.
            rows.append(("live gate", self.stopped or f"{quality(snap)} · {audit_line(snap)}"))
            age = self.now - snap.updated_at
            ago = "just now" if age < 1 else f"{duration(age)} ago"
            rows.append(("updated", f"{clock(snap.updated_at, self.now)}, {ago}"))
        for name, node in self.nodes:
            rows.append((f"node {name}", self._node(node)))
        if self.audit is not None:
            rows.append(("audit", self._audit()))
        width = max(len(label) for label, _ in rows) + 1
        return [f"{label + ':':<{width}} {text}" for label, text in rows]

    def _node(self, snap: ProgressSnapshot) -> str:
        """A node's share in one line: rows, the last minute's rate, its ETA or its end."""
        head = f"{snap.done:,} / {snap.total:,} rows generated ({pct(snap.fraction)})"
        if snap.ended:
            return f"{head}; {snap.ended}"
        return f"{head}; {compact(snap.tokens_per_s)} output tok/s; {self._eta(snap)[1]}"

    def _holder(self) -> str:
        record = self.lease
        if record is None:
            return "not running (no run has held this output's lease)"
        holder = record.holder
        if holder is None:
            return f"not running (the last run released the output at {self._at(record)})"
        dead = record.why_dead(self.now)
        if dead is not None:
            return (
                f"not running: its last holder ({holder.describe()}) ended without release: {dead}"
            )
        beat = duration(max(self.now - record.heartbeat_at, 0.0))
        return f"running: {holder.describe()}; lease renewed {beat} ago"

    def _at(self, record: LeaseRecord) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.heartbeat_at))

    def _speed(self, snap: ProgressSnapshot) -> str:
        # Over: the run's average, the one figure every report quotes; else the last minute's.
        if snap.ended or self.state:
            mean = snap.output_tokens / snap.elapsed_s if snap.elapsed_s > 0 else None
            return (
                f"{compact(mean)} output tok/s (this run's average over {duration(snap.elapsed_s)})"
            )
        return (
            f"{compact(snap.tokens_per_s)} output tok/s, {sig(snap.rows_per_s)} rows/s "
            "(the last minute)"
        )

    def _eta(self, snap: ProgressSnapshot) -> tuple[str, str]:
        if (snap.ended or "").startswith("stopped"):
            return "ended", "stopped by the live gate (below)"
        if snap.ended:
            return "ended", f"{snap.ended} in {duration(snap.elapsed_s)}"
        if self.state:
            return "ended", f"{self.state} (no ETA: the run's process is gone)"
        if snap.eta_s is None:
            return "ETA", "– (no rows answered in the last minute)"
        # The ETA was measured at the snapshot; said as a clock time and from now.
        at = snap.updated_at + snap.eta_s
        return "ETA", f"{clock(at, self.now)}, in {duration(max(at - self.now, 0.0))}"

    def _audit(self) -> str:
        assert self.audit is not None
        verdict = str(self.audit.get("verdict", "?")).upper()
        rows = self.audit.get("rows")
        counted = f" over {rows:,} rows" if isinstance(rows, int) else ""
        return f"{verdict}{counted} ({key_url(self.uri, AUDIT_MARKDOWN_KEY)})"


def read_status(storage: Storage, now: float | None = None) -> RunStatus:
    """The root's run at `now`; raises NoRun for a root that never held one."""
    from regen.canary.stop import read_stop_record
    from regen.dataset.manifest import take_census
    from regen.dataset.runinfo import read_run, run_fingerprint_of

    run = read_run(storage)
    raw = _json(storage, progress_key())
    nodes = [
        (node, snap)
        for key in storage.list(NODES_PREFIX)
        if (node := parse_progress_key(key)) is not None
        and (found := _json(storage, key)) is not None
        and (snap := ProgressSnapshot.from_dict(found)) is not None
    ]
    if not run and raw is None and not nodes:
        raise NoRun(f"{storage.uri}: no run here (no {RUN_KEY} and no progress.json)")
    census = take_census(storage, run_fingerprint_of(run))
    record = read_stop_record(storage)
    state = raw.get("state") if raw else None
    return RunStatus(
        uri=storage.uri,
        now=time.time() if now is None else now,
        run=run,
        progress=ProgressSnapshot.from_dict(raw) if raw else None,
        state=state if isinstance(state, str) else None,
        lease=read_lease(storage),
        committed_shards=len(census.committed),
        committed_rows=sum(m.rows for m in census.committed.values()),
        stopped=f"stopped: {record.gate_line()}" if record is not None else None,
        audit=_json(storage, AUDIT_REPORT_KEY),
        nodes=tuple(nodes),
    )


def _json(storage: Storage, key: str) -> dict[str, Any] | None:
    """A JSON object of the root, None when missing or not an object (a write in between)."""
    try:
        value = json.loads(storage.read_bytes(key))
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None
