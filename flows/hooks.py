"""State hooks: a cancelled or crashed run must not leave servers holding GPUs."""

from __future__ import annotations

from typing import Any

from prefect import Flow
from prefect.client.schemas.objects import FlowRun
from prefect.logging import get_logger
from prefect.states import State

from flows.params import config_parameter, open_run
from regen.fleet import reap_orphans
from regen.progress.snapshot import mark_state


def reap_fleet_on_exit(flow: Flow[Any, Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Stop every server this run's work dir records and mark its progress with the end state.

    Hooks get only the flow run, so the fleet is found through its PID files rather than an
    object: the same path works in the flow's own process and after it was killed.
    """
    logger = get_logger("regen.hooks")
    config = config_parameter(flow_run.parameters)
    if config is None:
        return
    # The output may be named by a block rather than the config (see `open_run`).
    run = open_run(config, storage_block=flow_run.parameters.get("storage_block"))
    stopped = reap_orphans(run.work_dir)
    logger.warning("run %s: %s; stopped %d server(s)", flow_run.name, state.name, len(stopped))
    node = flow_run.parameters.get("node")
    mark_state(
        run.storage,
        state.name or state.type.value,
        node.get("name") if isinstance(node, dict) else None,
    )
