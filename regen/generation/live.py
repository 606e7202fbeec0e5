"""The live gate inside a run: the canary before the plan is sent, then after every committed
shard its audit summary stored, merged into running figures and judged.

One mechanism with the final gate: each shard's summary is the one `regen audit` would make
(same key, same settings), so the final audit only merges. A stop is recorded
(`report/stopped.json`) and then reported by the caller; the shards already committed stay.
A server whose answers are far worse than the rest's is quarantined at the dispatcher and the
run goes on; its canary rows are not committed (their shards generate them again elsewhere).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from regen.audit.dataset import open_dataset
from regen.audit.gate import Decision, LiveGate, gate_decision
from regen.audit.summary import AuditSettings, audit_rows, settings_for
from regen.audit.thresholds import AuditConfig
from regen.canary import CanaryFirst, StopRecord, canary_key, canary_sample, run_canary
from regen.canary.stop import write_stop_record
from regen.client import Dispatcher
from regen.dataset.keys import summary_key
from regen.generation.plan import RunPlan
from regen.generation.shard import Commit, Log, RowSource
from regen.schema import row_schema
from regen.storage import Storage

_log = logging.getLogger(__name__)


class LiveAudit:
    """The canary and the rolling audit of one run (or node), shared by its shard threads."""

    def __init__(
        self,
        storage: Storage,
        plan: RunPlan,
        dispatcher: Dispatcher,
        settings: AuditSettings,
        *,
        on_figures: Callable[[dict[str, Any]], None] | None = None,
        log: Log = _log,
    ) -> None:
        self.storage = storage
        self.plan = plan
        self.dispatcher = dispatcher
        self.settings = settings
        self.gate = LiveGate(settings)
        self.record: StopRecord | None = None
        self.canary = pl.DataFrame(schema=row_schema())
        self._on_figures = on_figures
        self._log = log
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        storage: Storage,
        plan: RunPlan,
        dispatcher: Dispatcher,
        config: AuditConfig,
        tokenizer_path: Path | str | None,
        **kwargs: Any,
    ) -> LiveAudit:
        """The settings `regen audit` of this dataset would use, so its summaries are reused."""
        view = open_dataset(storage)
        settings = settings_for(storage, view, config, tokenizer_path=tokenizer_path)
        return cls(storage, plan, dispatcher, settings, **kwargs)

    @property
    def rows(self) -> RowSource:
        """Where the shards' rows come from: the canary's rows first, the rest sent."""
        return CanaryFirst(self.dispatcher, self.canary) if self.canary.height else self.dispatcher

    def stopped(self) -> bool:
        return self.record is not None

    def run_canary(self, size: int) -> Decision | None:
        """Send `size` prompts spread over the pending shards and judge their rows at once
        (no `live_min_rows`: the canary is the sample). None when there is no canary."""
        sample = canary_sample(self.plan.prompt_cache, self.plan.pending, size)
        if not sample.height:
            return None
        rows = run_canary(self.dispatcher, self.storage, self.plan.fingerprint, sample)
        summary = audit_rows(rows, self.settings)
        decision = gate_decision(summary, self.settings, min_rows=0)
        self._quarantine(decision)
        # Rows of a quarantined server stay in the store for inspection, not in the dataset.
        dropped = list(self.gate.quarantined)
        self.canary = rows.filter(~pl.col("server").is_in(dropped)) if dropped else rows
        self._log.info(
            "canary: %d prompts over %d shards, %s", rows.height, len(self.plan.pending),
            decision.reason,
        )  # fmt: skip
        if decision.action == "stop":
            self._stop("canary", decision, summary.rows, canary=canary_key(self.plan.fingerprint))
        return decision

    def on_commit(self, commit: Commit) -> None:
        """A shard just committed: store its summary, merge it and judge the running figures.

        A shard whose error rows alone were generated again is left to the final audit, which
        summarises it whole. Never raises for the gate's sake: a stop is recorded, and the
        caller stops sending new shards."""
        if commit.rows.height != commit.manifest.rows:
            return
        sources = {commit.shard: commit.manifest.sha256}
        summary = audit_rows(commit.rows, self.settings, sources=sources)
        self.storage.write_bytes(summary_key(commit.shard, self.settings.key), summary.to_json())
        with self._lock:
            decision = self.gate.update(summary)
            self._quarantine(decision)
            if decision.action == "stop" and self.record is None:
                assert self.gate.summary is not None
                self._stop("rolling", decision, self.gate.summary.rows)
        if self._on_figures is not None:
            self._on_figures(decision.figures)

    def _quarantine(self, decision: Decision) -> None:
        for found in decision.quarantine:
            try:
                self.dispatcher.quarantine(found.server, f"live audit: {found.line()}")
            except ValueError as err:  # the last server able to serve: stopping is the caller's
                self._log.warning("could not quarantine %s: %s", found.server, err)
                continue
            self.gate.quarantined.add(found.server)
            self._log.warning("quarantined %s", found.line())

    def _stop(self, stage: str, decision: Decision, rows: int, canary: str | None = None) -> None:
        stats = self.dispatcher.stats()
        self.record = StopRecord(
            fingerprint=self.plan.fingerprint,
            stage="canary" if stage == "canary" else "rolling",
            rows_audited=rows,
            prompts_sent=stats.submitted,
            prompts_planned=self.plan.num_rows,
            checks=decision.failing,
            canary=canary,
        )
        write_stop_record(self.storage, self.record)
        self._log.error("live gate: %s", self.record.reason())
