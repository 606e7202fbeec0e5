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
from regen.client.tuning import for_run
from regen.concurrency import TunerSettings
from regen.concurrency.tuner import ConcurrencyTuner
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
    """Requests the fleet serves at once at the start (servers x concurrency)."""
    final: ProgressSnapshot | None = None
    """The last snapshot, taken as generation ends (set when the `with` block exits)."""

    def slots_now(self) -> int:
        """Requests the fleet serves at once now: each server's concurrency as tuned so far.
        The shards held open follow it, not the servers' caps: held for the caps, a whole run
        was in flight at once and the rolling audit's stop came after every shard had been
        generated."""
        return sum(server.slots for server in self.dispatcher.stats().servers)

    def committed(self, outcome: ShardOutcome) -> None:
        """Count a committed shard's rows in the progress (the dispatcher counts answers)."""
        self.progress.shard_committed(outcome.rows, outcome.ok, outcome.failed)


def concurrency_caps(config: RegenConfig, fleet: Fleet) -> dict[str, int]:
    """The most requests regen may keep in flight on each server: the config's cap, the
    server's own max_running_requests (its /server_info, in the fleet report) and the tuner's
    ceiling; just the fixed number with concurrency_per_server."""
    if not config.tuned:
        return {e.name: config.concurrency for e in fleet.endpoints}
    ceiling = TunerSettings().max_concurrency
    if config.engine.max_running_requests is not None:
        ceiling = min(ceiling, config.engine.max_running_requests)
    own = {r.server: r.max_running_requests for r in fleet.report}
    return {e.name: max(1, min(ceiling, own.get(e.name) or ceiling)) for e in fleet.endpoints}


def dispatcher_for(
    config: RegenConfig, fleet: Fleet, api_key: SecretStr, slot_cap: int | None = None
) -> Dispatcher:
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
        tuning=for_run(config),
        # Launched servers are relaunched (`Supervisor`): the fleet is gone only once none
        # can come back; an external fleet keeps generation.fleet_dead_s.
        supervised=bool(fleet.launched),
        slot_cap=slot_cap,
    )


@contextmanager
def tuning(
    config: RegenConfig, fleet: Fleet, dispatcher: Dispatcher, caps: dict[str, int]
) -> Iterator[ConcurrencyTuner | None]:
    """Each server's concurrency measured while the block runs (None with a fixed one); the
    levels it reached go into the fleet report."""
    if not config.tuned:
        yield None
        _record_concurrency(fleet, {e.name: config.concurrency for e in fleet.endpoints})
        return
    settings = TunerSettings(interval_s=config.generation.concurrency_interval_s)
    tuner = ConcurrencyTuner(
        dispatcher, fleet.endpoints, caps, start=config.concurrency, settings=settings
    )
    with tuner:
        yield tuner
    _record_concurrency(fleet, tuner.levels())


def _record_concurrency(fleet: Fleet, levels: dict[str, int]) -> None:
    fleet.update_report(
        [
            row.model_copy(update={"concurrency": levels[row.server]})
            for row in fleet.report
            if row.server in levels
        ]
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
    caps = concurrency_caps(config, fleet)
    dispatcher = dispatcher_for(config, fleet, api_key, slot_cap=max(caps.values()))

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
            tuning(config, fleet, dispatcher, caps),
        ):
            feed = Feed(dispatcher, progress, slots=len(fleet.endpoints) * config.concurrency)
            yield feed
            feed.final = progress.snapshot()
    finally:
        _write_final(storage, rows())


def _write_final(storage: Storage, rows: list[FleetRow]) -> None:
    """The fleet as generation left it (each server's concurrency and cut answers); a report
    not written must not hide why it ended, nor fail a run whose rows are committed."""
    try:
        write_fleet_report(storage, rows)
    except Exception as err:
        log.warning("could not write the fleet report: %s", err)
