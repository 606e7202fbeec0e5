"""The live gate inside a run: the canary sent ahead of the plan and judged while the shards
fill the slots behind it (their commits held for its verdict), then after every committed
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
from concurrent import futures
from pathlib import Path
from typing import Any

import polars as pl

from regen.audit.dataset import open_dataset
from regen.audit.rolling import Decision, RollingAudit, judge
from regen.audit.settings import AuditSettings, settings_for
from regen.audit.summary import audit_rows, merge
from regen.audit.summary_model import Summary
from regen.canary import (
    CanaryFirst,
    CanaryStopped,
    HeldForCanary,
    PendingCanary,
    StopRecord,
    Verdict,
    canary_key,
    canary_sample,
    read_canary,
    send_canary,
)
from regen.canary.stop import write_stop_record
from regen.client import Dispatcher
from regen.config import AuditConfig
from regen.dataset.keys import summary_key
from regen.generation.run_plan import RunPlan
from regen.generation.shard import Commit, Log, RowSource
from regen.schema import row_schema
from regen.storage import Storage

_log = logging.getLogger(__name__)


class LiveGate:
    """The live gate of one run (or node): its canary and its rolling audit, shared by its
    shard threads."""

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
        self.gate = RollingAudit(settings)
        self.record: StopRecord | None = None
        self.canary = pl.DataFrame(schema=row_schema())
        self.reused = 0
        """Canary rows an earlier, cut-short run of this plan stored, reused instead of sent."""
        self._held: HeldForCanary | None = None
        self._judging: threading.Thread | None = None
        self._decision: Decision | None = None
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
    ) -> LiveGate:
        """The settings `regen audit` of this dataset would use, so its summaries are reused."""
        view = open_dataset(storage)
        settings = settings_for(storage, view, config, tokenizer_path=tokenizer_path)
        return cls(storage, plan, dispatcher, settings, **kwargs)

    @property
    def rows(self) -> RowSource:
        """Where the shards' rows come from: held for the canary's verdict while it runs, then
        the canary's rows first and the rest sent."""
        if self._held is not None:
            return self._held
        return CanaryFirst(self.dispatcher, self.canary) if self.canary.height else self.dispatcher

    def stopped(self) -> bool:
        return self.record is not None

    def start_canary(self, size: int, slots: int = 0) -> None:
        """Queue `size` prompts spread over the pending shards ahead of every shard and judge
        their rows in a thread of their own, each part as it comes back (no `live_min_rows`:
        the canary is the sample). Meanwhile the shards' rows keep every slot it frees busy and
        their commits wait for the verdict (`HeldForCanary`): the fleet does not idle on the
        canary's tail or its audit, and a stop cancels what they have in flight (`slots`, the
        fleet's, only says in waves how many went out behind it)."""
        sample = canary_sample(self.plan.prompt_cache, self.plan.pending, size)
        if not sample.height:
            return
        if self.plan.committed_rows and sample.height < size:
            # A rerun's top-up smaller than the canary: the canary would be all of it, judged
            # alone on a few rows. It is generated as is and judged with the rest of the
            # dataset by the final audit. Canary rows a cut-short run stored are still used.
            self.canary = read_canary(self.storage, self.plan.fingerprint)
            self.reused = _among(self.canary, sample)
            self._log.info(
                "canary: none, the %d prompts to generate are fewer than its %d; judged with "
                "the dataset's %d committed rows", sample.height, size, self.plan.committed_rows,
            )  # fmt: skip
            return
        before = self.dispatcher.stats().sent
        pending = send_canary(self.dispatcher, self.storage, self.plan.fingerprint, sample)
        self.reused = _among(pending.stored, sample)
        verdict: futures.Future[Verdict] = futures.Future()
        self._held = HeldForCanary(self.dispatcher, sample, verdict)
        self._judging = threading.Thread(
            target=self._judge_canary, args=(pending, verdict, before, slots),
            name="regen-canary", daemon=True,
        )  # fmt: skip
        self._judging.start()

    def canary_verdict(self) -> Decision | None:
        """Wait for the canary's verdict (None when there was no canary); raise what failed
        it (a dead fleet, storage)."""
        if self._judging is None:
            return None
        self._judging.join()
        assert self._held is not None
        error = self._held.verdict.exception()
        if error is not None and not isinstance(error, CanaryStopped):
            raise error
        return self._decision

    def _judge_canary(
        self, pending: PendingCanary, verdict: futures.Future[Verdict], before: int, slots: int
    ) -> None:
        try:
            # Each part is audited as it comes back, while the rest run: once the last is in,
            # only its audit stands between the canary's last answer and the verdict.
            parts = {k: audit_rows(rows, self.settings) for k, rows in pending.arrived()}
            rows = pending.rows()  # every part is in: nothing waited on
            summary = one_sample(parts)
            decision = judge(summary, self.settings, min_rows=0)
            self._quarantine(decision)
        except BaseException as err:
            verdict.set_exception(err)
            return
        # Rows of a quarantined server stay in the store for inspection, not in the dataset.
        dropped = list(self.gate.quarantined)
        self.canary = rows.filter(~pl.col("server").is_in(dropped)) if dropped else rows
        self._decision = decision

        def said() -> None:
            self._log.info(
                "canary: %d prompts over %d shards, %s; %s", rows.height,
                len(self.plan.pending), decision.reason, _behind(behind, slots),
            )  # fmt: skip

        if decision.action != "stop":
            behind = self.dispatcher.stats().sent - before - pending.sent
            verdict.set_result(Verdict(self.canary, frozenset(self.gate.quarantined)))
            said()
            # Stored once the shards have their go, off the fleet's path: the rows reach the
            # dataset through their shards' commits, the store only spares a resumed run
            # sending them again (a run cut short before this sends them again).
            try:
                pending.store()
            except Exception as err:  # e.g. a full disk, which the shards' commits meet too
                self._log.warning("canary: its rows were not stored (%s)", err)
            return
        # Cancel what the held shards have in flight first, so the record counts what the
        # servers were sent, then tell the shards: none of them commits.
        stop = CanaryStopped(f"the live gate stopped the run at the canary: {decision.reason}")
        self.dispatcher.abort(stop)
        behind = self.dispatcher.stats().sent - before - pending.sent
        said()
        try:
            pending.store()  # kept beside the stop record, for a person to read
        except BaseException as err:
            verdict.set_exception(err)
            return
        self._stop("canary", decision, summary.rows, canary=canary_key(self.plan.fingerprint))
        verdict.set_exception(stop)

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
            prompts_sent=stats.sent,
            prompts_planned=self.plan.num_rows,
            checks=decision.failing,
            canary=canary,
        )
        write_stop_record(self.storage, self.record)
        self._log.error("live gate: %s", self.record.reason())


def one_sample(parts: dict[int, Summary]) -> Summary:
    """The canary's summary from those of its parts, merged in part order: the figures of one
    audit of every row (template parity renders up to its quota in each part, and counts the
    canary as one shard, as one audit of it does)."""
    summary = merge(parts[k] for k in sorted(parts))
    if summary.parity.shards > 1:
        summary.parity = summary.parity.model_copy(update={"shards": 1})
    return summary


def _behind(rows: int, slots: int) -> str:
    """The shard rows sent while the canary ran, in waves of the fleet's slots."""
    waves = f" ({rows / slots:.1f} waves of {slots:,} slots)" if slots else ""
    return f"{rows:,} shard rows sent behind it{waves}"


def _among(rows: pl.DataFrame, sample: pl.DataFrame) -> int:
    """How many stored canary rows stand in for prompts of this plan's sample (the store
    also holds rows of shards committed since, which no shard takes again)."""
    return rows.join(sample.select("id"), on="id", how="semi").height
