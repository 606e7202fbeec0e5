"""The one dispatcher every shard of a run (or node) feeds, and the progress it is measured by.

One continuous queue across shard borders keeps the servers busy while each shard stays a
retryable unit; `progress.json` and the live fleet figures are written beside it. Where the
figures are shown (a Prefect artifact, a terminal) is the caller's: it passes callbacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import SecretStr

from regen.client import Dispatcher
from regen.config import RegenConfig
from regen.fleet import Fleet
from regen.fleet.metrics import FleetScraper
from regen.fleet.report import FleetRow, with_cut_answers, write_fleet_report
from regen.fleet.supervisor import Supervisor
from regen.generation.outcome import ShardOutcome
from regen.generation.run_plan import RunPlan
from regen.progress.fleet_live import LiveReport, LiveWatch
from regen.progress.snapshot import ProgressSnapshot
from regen.progress.writer import ProgressWriter
from regen.storage import Storage

log = logging.getLogger(__name__)


@dataclass
class Feed:
    dispatcher: Dispatcher
    progress: ProgressWriter
    slots: int
    """Requests the fleet serves at once (servers x concurrency)."""
    final: ProgressSnapshot | None = None
    """The last snapshot, taken as generation ends (set when the `with` block exits)."""

    def committed(self, outcome: ShardOutcome) -> None:
        """Count a committed shard's rows in the progress (the dispatcher counts answers)."""
        self.progress.shard_committed(outcome.rows, outcome.ok, outcome.failed)


def dispatcher_for(config: RegenConfig, fleet: Fleet, api_key: SecretStr) -> Dispatcher:
    """The run's dispatcher over `fleet` (not started: use it as a context manager)."""
    return Dispatcher(
        fleet.endpoints,
        api_key=api_key,
        model=config.model.served_name,
        sampling=config.sampling,
        regeneration=config.regeneration,
        generation=config.generation,
        concurrency_per_server=config.concurrency,
        reprobe=fleet.reprobe,
        # Launched servers are relaunched (`Supervisor`): the fleet is gone only once none
        # can come back; an external fleet keeps generation.fleet_dead_s.
        supervised=bool(fleet.launched),
    )


@contextmanager
def feeding(
    config: RegenConfig,
    storage: Storage,
    plan: RunPlan,
    fleet: Fleet,
    api_key: SecretStr,
    *,
    progress_key: str,
    on_progress: Callable[[ProgressSnapshot], None] | None = None,
    on_live: Callable[[LiveReport], None],
) -> Iterator[Feed]:
    """Dispatcher, progress writer (at `progress_key`), live watch and the fleet's supervisor
    (which rewrites `report/fleet.json` at each relaunch) for the length of the `with` block;
    the supervisor stops first, so it never calls a closed dispatcher. The fleet report, with
    each server's cut answers, is written once more as generation ends, however it ends."""
    dispatcher = dispatcher_for(config, fleet, api_key)

    def rows() -> list[FleetRow]:
        cut = {s.name: s.cut_answers for s in dispatcher.stats().servers}
        return with_cut_answers(fleet.report, cut)

    try:
        with (
            dispatcher,
            ProgressWriter(
                storage,
                dispatcher,
                total=plan.num_rows,
                already_done=plan.committed_rows,
                interval_s=config.generation.progress_interval_s,
                on_update=on_progress,
                key=progress_key,
            ) as progress,
            LiveWatch(
                progress,
                FleetScraper(fleet.endpoints),
                interval_s=config.generation.live_interval_s,
                on_update=on_live,
                fleet=rows,
            ),
            Supervisor(
                fleet,
                dispatcher,
                config.engine.relaunch,
                startup_timeout_s=config.engine.startup_timeout_s,
                on_change=lambda _: write_fleet_report(storage, rows()),
            ),
        ):
            feed = Feed(dispatcher, progress, slots=len(fleet.endpoints) * config.concurrency)
            yield feed
            feed.final = progress.snapshot()
    finally:
        _write_final(storage, rows())


def _write_final(storage: Storage, rows: list[FleetRow]) -> None:
    """The fleet as generation left it; a report not written must not hide why it ended."""
    try:
        write_fleet_report(storage, rows)
    except Exception as err:
        log.warning("could not write the fleet report: %s", err)
