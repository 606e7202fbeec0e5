"""A run's progress as one value: what `progress.json` holds, written and read back.

The value carries figures only (no thread, no terminal, no words): the writer
(`regen.progress.writer`) makes one every few seconds, `regen status` reads it back from the
root, and `regen.display.progress` says it in a card, a headline or a table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from regen.dataset.keys import progress_key
from regen.storage import Storage


@dataclass(frozen=True, slots=True)
class ServerProgress:
    name: str
    state: str
    in_flight: int
    slots: int
    tokens_per_s: float
    output_tokens: int = 0
    """This run's output tokens from the server: over the elapsed time, its run average."""


@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """`done` includes rows committed by earlier runs (`already_done`); rates are this run's.

    Two counts of rows, never mixed: `done` rows were generated (answered by a server),
    `rows_committed` are in the dataset (their shard's manifest is written). A stopped run
    generated rows it never committed; every report names which one it shows."""

    updated_at: float
    elapsed_s: float
    total: int
    done: int
    already_done: int
    ok: int
    failed: int
    in_flight: int
    queued: int
    retries: int
    shards_committed: int
    rows_committed: int
    output_tokens: int
    tokens_per_s: float
    """The last minute's rate while the run goes; once it has ended, the run's average."""
    rows_per_s: float
    eta_s: float | None
    servers: tuple[ServerProgress, ...]
    audit: dict[str, Any] | None = None
    """The rolling audit's running figures (`regen.audit.gate.running_figures`), once a shard
    has committed."""
    ended: str | None = None
    """How generation ended (`finished`, or `stopped: <the gate's verdict>`), once it has."""

    @property
    def fraction(self) -> float:
        """The share of the plan generated."""
        return min(self.done / self.total, 1.0) if self.total else 1.0

    @property
    def committed_fraction(self) -> float:
        """The share of the plan in the dataset."""
        return min(self.rows_committed / self.total, 1.0) if self.total else 1.0

    @property
    def stopped(self) -> bool:
        return bool(self.ended and self.ended.startswith("stopped"))

    @property
    def shown_fraction(self) -> float:
        """What a progress bar shows: the share generated, but for a stopped run the share
        committed (its generated rows past the last commit are not in the dataset)."""
        return self.committed_fraction if self.stopped else self.fraction

    def as_ended(self, how: str) -> ProgressSnapshot:
        """The snapshot of a run that is over: no ETA (a stopped one would show the time its
        rest would have taken), and every rate its run average, not the last minute's drain
        (a server finishing its last rows looked sick beside its peers)."""
        span = self.elapsed_s

        def mean(tokens: int) -> float:
            return tokens / span if span > 0 else 0.0

        return replace(
            self,
            ended=how,
            eta_s=None,
            tokens_per_s=mean(self.output_tokens),
            servers=tuple(replace(s, tokens_per_s=mean(s.output_tokens)) for s in self.servers),
        )

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "fraction": self.fraction}, indent=2).encode()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ProgressSnapshot | None:
        """`progress.json` read back as the snapshot it was written from (`to_json`); fields
        this version does not know are dropped. None for an empty or older one (`mark_state`
        on a run that wrote none)."""
        known = {f.name for f in fields(cls)} - {"servers"}
        server_fields = {f.name for f in fields(ServerProgress)}
        try:
            servers = tuple(
                ServerProgress(**{k: v for k, v in s.items() if k in server_fields})
                for s in raw.get("servers") or ()
            )
            return cls(**{k: v for k, v in raw.items() if k in known}, servers=servers)
        except (TypeError, AttributeError):
            return None


def mark_state(storage: Storage, state: str, node: str | None = None) -> str:
    """Add how the run's process ended (`Cancelled`, `Crashed`) to its last progress, or to
    an empty one: a watcher of the root sees that no snapshot will follow. The key written."""
    key = progress_key(node)
    try:
        progress = json.loads(storage.read_bytes(key))
    except (FileNotFoundError, ValueError):
        progress = {}
    if not isinstance(progress, dict):
        progress = {}
    progress["state"] = state
    storage.write_bytes(key, json.dumps(progress, indent=2).encode())
    return key
