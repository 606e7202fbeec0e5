"""Run the flow from the command line: one line on failure, signals stop the fleet and say
how to resume (`regen.machine.interrupt`)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, cast

from regen.config import RegenConfig
from regen.dataset.keys import AUDIT_MARKDOWN_KEY, key_url
from regen.display.figures import sig
from regen.errors import UserError
from regen.fleet import reap_orphans
from regen.fleet.orphans import reap_spawned
from regen.generation.stopped import GenerationStopped
from regen.machine.interrupt import (
    Interrupts,
    argv,
    exit_code,
    resume_command,
    resume_line,
    signal_of,
)
from regen.machine.owned import reap_owned, tag_children

# What Prefect 3.9.1 sets in the environment of the temporary API server it starts in a
# subprocess when no server is configured (prefect.server.api.server.SubprocessASGIServer).
EPHEMERAL_SERVER_ENV = {"PREFECT__SERVER_EPHEMERAL": "1"}

if TYPE_CHECKING:
    from prefect.client.schemas.objects import State

    from flows.ephemeral import TemporaryServer
    from flows.regenerate import RunSummary


class _NoTracebackForTheUser(logging.Filter):
    """A user's mistake is a one-line message on the terminal, not Prefect's traceback; so is
    whatever an interrupted run raises while it unwinds (the user asked it to stop)."""

    def __init__(self, interrupts: Interrupts) -> None:
        super().__init__()
        self.interrupts = interrupts

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, UserError) or (exc is not None and self.interrupts.received):
            record.exc_info = None
            record.exc_text = None
        return True


def _quiet_tracebacks(interrupts: Interrupts) -> None:
    from prefect.logging.configuration import setup_logging

    setup_logging()
    for handler in logging.getLogger().handlers:
        handler.addFilter(_NoTracebackForTheUser(interrupts))


def _reap_ephemeral_servers() -> None:
    """Stop the temporary Prefect servers of runs that were killed, and tag this run's own.

    Prefect stops its temporary server at exit, which a kill -9 skips, and gives no way to
    tie the server's life to ours; so a killed run's server (~200 MB) lives on until the
    next run stops it here, found by the owner tag it inherited from its run.
    """
    # Only servers of this Prefect home: another home's orphan is that setup's next run's to
    # reap, and a parallel run of another home never has its own taken from under it.
    reaped = reap_owned({**EPHEMERAL_SERVER_ENV, "PREFECT_HOME": os.environ.get("PREFECT_HOME")})
    if reaped:
        print(
            f"regen: stopped {len(reaped)} orphan Prefect server(s) of an earlier run: {reaped}",
            file=sys.stderr,
        )
    tag_children()


def _interrupts(config: RegenConfig, server: TemporaryServer | None) -> Interrupts:
    """Ctrl-C, SIGTERM and SIGHUP unwind the run (every `finally` stops the fleet); the
    watchdog bounds the unwinding, whatever Prefect's API does meanwhile."""
    return Interrupts(
        line=lambda sig: resume_line(sig, config.output, argv()),
        stop_fleet=lambda: (reap_orphans(config.work_dir), reap_spawned()),
        on_force=server.kill if server is not None else lambda: None,
    )


def _start_prefect() -> TemporaryServer | None:
    """Reap what killed runs left, then start this run's temporary Prefect server (none with a
    configured one) before the flow is imported, so the two overlap (flows.ephemeral)."""
    from flows.ephemeral import start_temporary_server

    _reap_ephemeral_servers()
    return start_temporary_server()


def run_regenerate(config: RegenConfig) -> int:
    """Run `regenerate_completions` in this process; exit 0 on a passed or warned gate."""
    server = _start_prefect()
    interrupts = _interrupts(config, server)
    _quiet_tracebacks(interrupts)
    from flows.ephemeral import settle
    from flows.regenerate import regenerate_completions

    if server is not None:
        server.wait_ready()
    try:
        with interrupts.installed():
            state = regenerate_completions(config, return_state=True)
            if interrupts.received is None:  # a stop asked for is not kept waiting
                # Before it is stopped at exit: a server cut mid-write prints tracebacks.
                settle(server)
    except KeyboardInterrupt as err:
        return _interrupted(interrupts, config, signal_of(err))
    if interrupts.received is not None:
        # The interrupt landed where Prefect turns it into another error (a task starting:
        # `ValueError: Task run is not set`) and the flow ended Failed: still the user's stop.
        return _interrupted(interrupts, config, interrupts.received)
    return _outcome(state, config)


def run_features(config: RegenConfig) -> int:
    """Run `capture_features` in this process (`regen features`); exit 0 when every pending
    shard was captured."""
    server = _start_prefect()
    interrupts = _interrupts(config, server)
    _quiet_tracebacks(interrupts)
    from flows.features import capture_features

    if server is not None:
        server.wait_ready()
    try:
        with interrupts.installed():
            state = capture_features(config, return_state=True)
    except KeyboardInterrupt as err:
        return _interrupted(interrupts, config, signal_of(err))
    if interrupts.received is not None:
        return _interrupted(interrupts, config, interrupts.received)
    if not state.is_completed():
        ended = (state.name or state.type.value).lower()
        print(f"regen: features {ended}: {failure_reason(state)}", file=sys.stderr)
        print("features: committed shards are kept; run it again to resume", file=sys.stderr)
        return 1
    summary = state.result()
    print(
        f"features: {summary.samples:,} samples in {summary.shards:,} shards at "
        f"{summary.dest} ({summary.captured_shards:,} captured by this run, "
        f"{summary.failed:,} refused by the server)"
    )
    return 0


def _interrupted(interrupts: Interrupts, config: RegenConfig, raised: signal.Signals) -> int:
    sig = interrupts.received or raised
    reap_spawned()  # the teardown stopped the servers it knew of; a server spawned as it began
    print(resume_line(sig, config.output, argv()), file=sys.stderr)
    interrupts.said = True
    return exit_code(sig)


def _outcome(state: State[Any], config: RegenConfig) -> int:
    """What the terminal shows of the flow's final state, and the exit code."""
    if state.is_completed():
        # Completed means the flow returned its summary; a failed gate returns a Failed state.
        summary = cast("RunSummary", state.result())
        print(f"dataset: {summary.output}")
        rows = f"{summary.rows_ok:,} ok, {summary.rows_failed:,} failed"
        print(f"rows: {rows}; {_generated(summary)}")
        print(f"audit: {summary.verdict} (report: {key_url(summary.output, AUDIT_MARKDOWN_KEY)})")
        return 0
    ended = (state.name or state.type.value).lower()
    raised = state.result(raise_on_failure=False) if state.is_failed() else None
    if isinstance(raised, GenerationStopped):
        # Its line says what is kept and how to resume: with the command typed here.
        first, *more = raised.message(resume_command(argv())).splitlines()
    else:
        first, *more = failure_lines(state)
    print(f"regen: run {ended}: {first}", file=sys.stderr)
    for line in more:  # a failed gate's checks, one a line, and where its data is
        print(f"  {line}", file=sys.stderr)
    if not isinstance(raised, GenerationStopped):
        print(f"dataset: {config.output} (committed shards are kept)", file=sys.stderr)
    return 1


def _generated(summary: RunSummary) -> str:
    """What this run generated, at the rate its artifacts quote; a rerun with nothing left to
    do says so, not `0 tokens at 0 tok/s`."""
    if summary.rows_generated == 0 and summary.completion_tokens == 0:
        return "nothing left to generate (every row was committed by an earlier run)"
    return (
        f"this run generated {summary.rows_generated:,} rows, "
        f"{summary.completion_tokens:,} output tokens at {sig(summary.tokens_per_s)} tok/s"
    )


def failure_reason(state: State[Any]) -> str:
    """One line: what the run raised, in its own words (a UserError's are the user's), or
    else the first line of the state's message (a failed gate's `FAIL: ...`, or a crash)."""
    return failure_lines(state)[0]


def failure_lines(state: State[Any]) -> list[str]:
    """What the terminal says of a run that did not complete: what it raised, on one line, or
    else every line of the state's message (a failed gate's or provisioning's reason: its
    short form, one line per failing check, where the data was kept)."""
    from prefect.exceptions import CancelledRun, CrashedRun, FailedRun

    raised = state.result(raise_on_failure=False) if state.is_failed() else None
    # A state's own message comes back wrapped when the state holds no result.
    if isinstance(raised, Exception) and not isinstance(
        raised, (FailedRun, CrashedRun, CancelledRun)
    ):
        text = str(raised) or type(raised).__name__
        return [(text.strip().splitlines() or [text])[0]]
    text = state.message or state.name or state.type.value
    return [line for line in text.strip().splitlines() if line.strip()] or [text]
