"""A run that fails for a reason it knows reads as that reason, in one place, without a traceback.

A failed gate or a failed provisioning check is an outcome, not a crash: the task or flow
returns `Failed(message=...)` instead of raising, and the flow returns the task's Failed state
on (`failed_with`). The state's message is the reason; the run's final state stays Failed, in
`regen run` and in a deployment alike.

Prefect 3.9.1 still logs two tracebacks for such an ending, both its own frames and both
noise: a task that returns a Failed state logs `Task run failed with state: Failed(...)` with
an empty `exc_info` (`NoneType: None`) before its `Finished in state Failed(...)`, and a
deployment's engine (`python -m prefect.engine`, which asks the flow run for its result)
raises `FailedRun` for a returned Failed state and logs ~40 lines under `Engine execution
exited with unexpected exception`. `quiet_failures` filters both out of the run loggers, and
strips the traceback from a `UserError` (the user's mistake, said in its own words) as
`regen run` does on the terminal; the last line of a run that failed this way is then
`Finished in state Failed('<the reason>')`.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.exceptions import FailedRun
from prefect.states import Failed, State

from regen.canary.stop import read_stop_record
from regen.errors import UserError
from regen.generation.run_plan import RunPlan
from regen.generation.stopped import generation_stopped
from regen.run import OpenedRun
from regen.storage import Storage

# Prefect's loggers of a flow run's and a task run's lines (prefect.logging.loggers).
_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
# What the engine of a deployment's flow run logs when the run's result raises
# (prefect.flow_engine.run_flow), and what a task that returned a Failed state logs
# (prefect.task_engine.handle_retry): both said again by `Finished in state Failed(...)`.
_ENGINE_EXIT = "Engine execution exited with unexpected exception"
_RETURNED_FAILED = "Task run failed with state: "


class _QuietFailures(logging.Filter):
    """Drop Prefect's repeats of a run that ended Failed with a reason; no traceback for one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return True
        exc = record.exc_info[1]
        said = record.getMessage()
        if exc is None:  # logged with exc_info=True outside any `except`
            if said.startswith(_RETURNED_FAILED):
                return False
        elif isinstance(exc, (FailedRun, UserError)):
            if said == _ENGINE_EXIT:
                return False
        else:
            return True
        record.exc_info = None
        record.exc_text = None
        return True


_FILTER = _QuietFailures()


def quiet_failures() -> None:
    """Filter Prefect's run loggers in this process (once; each flow calls it as it starts, so a
    deployment's flow-run process has it before its engine logs the run's end)."""
    for name in _RUN_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def failed_with(state: State[Any]) -> State[None] | None:
    """The flow's Failed state for a task that ended Failed with a reason (it returned
    `Failed(message=...)`): the same message. None for a task that completed; what a task
    raised (or a crash) is raised again, as calling it without `return_state` would have."""
    if state.is_completed():
        return None
    try:
        state.result()
    except FailedRun:  # returned, not raised: its message is the reason
        if state.is_failed():
            return Failed(message=state.message)
        raise
    raise AssertionError(f"the result of a run that did not complete did not raise: {state!r}")


def generation_failure(
    run: OpenedRun, plan: RunPlan, err: Exception, node: str | None = None
) -> State[None]:
    """The Failed state of a run (or a node of a multi-node run) whose generation stopped for
    a cause no shard gets past (`regen.generation.shard.stops_run`): its one line as the
    message, the stop as its data (the command line reads it to name its own resume command),
    returned rather than raised: no `Encountered exception` and no traceback."""
    stop = generation_stopped(
        run.storage, plan.fingerprint, plan.num_shards, err, output=run.output,
        key_source=run.key_source, node=node,
    )  # fmt: skip
    return Failed(message=stop.message(), data=stop)


def stop_failure(storage: Storage, stopped: str) -> State[None]:
    """The Failed state of a node of a multi-node run that its live gate stopped (the parent
    audits the dataset): the stop in short, then one line per failing check, from the stop's
    record (`report/stopped.json`); `stopped`, its one line, if the record is gone."""
    record = read_stop_record(storage)
    if record is None:
        return Failed(message=f"FAIL: {stopped}")
    lines = [f"FAIL: {record.headline()}", *(f"- {line}" for line in record.check_lines())]
    return Failed(message="\n".join(lines))
