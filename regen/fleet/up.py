"""Stage 3 whole: the run's fleet attached or launched, measured, its report written.

Which fleet (an external one attached, else servers launched from the config), and that a
fleet whose measuring or reporting fails is torn down before the error goes on, are decided
here; the caller (tasks/setup.py) only logs and publishes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from regen.config import RegenConfig
from regen.fleet.bench import benchmark_fleet
from regen.fleet.commands import ServerCommand, build_server_commands
from regen.fleet.handle import Fleet
from regen.fleet.launch import attach_fleet, launch_fleet
from regen.fleet.report import write_fleet_report
from regen.storage import Storage


def bring_up_fleet(
    config: RegenConfig,
    model_path: Path,
    api_key: SecretStr,
    storage: Storage,
    *,
    on_launch: Callable[[list[ServerCommand]], None] = lambda _: None,
    on_ready: Callable[[Fleet], None] = lambda _: None,
    run_id: str | None = None,
) -> Fleet:
    """Servers that answered a real generation, benchmarked, `report/fleet.json` written.

    `on_launch` sees the commands before any server starts (none on an external fleet);
    `on_ready` sees the measured fleet (to publish it). If anything after the fleet came up
    fails, `on_ready` included, the fleet is torn down before the error is raised: the caller
    owns the teardown (a `with` block) only of a fleet it was handed. `run_id` keeps the
    servers' key, PID and log files in that run's own directory (`commands.run_dir`).
    """
    if config.engine.kind == "external":
        fleet = attach_fleet(config, api_key)
    else:
        commands = build_server_commands(config, model_path, api_key, config.work_dir, run_id)
        on_launch(commands)
        fleet = launch_fleet(config, commands, api_key)
    try:
        benchmark_fleet(fleet, **config.engine.bench.model_dump())
        write_fleet_report(storage, fleet.report)
        on_ready(fleet)
    except BaseException:
        fleet.teardown()
        raise
    return fleet
