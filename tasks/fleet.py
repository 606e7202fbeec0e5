"""Stage 3 as a Prefect task: the fleet up, probed, benchmarked; its report as an artifact."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from pydantic import SecretStr

from regen.config import RegenConfig
from regen.fleet import Fleet, attach_fleet, benchmark_fleet, build_server_commands, launch_fleet
from regen.fleet import reap_orphans as reap
from regen.fleet.report import fleet_markdown
from regen.naming import artifact_key, dataset_name
from regen.storage import open_storage


@task(name="launch-fleet", persist_result=False)
def start_fleet(config: RegenConfig, model_path: Path, api_key: SecretStr) -> Fleet:
    """Servers that answered a real generation; the caller owns teardown (a `with` block)."""
    logger = get_run_logger()
    engine = config.engine
    if engine.kind == "external":
        fleet = attach_fleet(config, api_key)
    else:
        commands = build_server_commands(config, model_path, api_key, config.work_dir)
        logger.info(
            "launching %d %s server(s) on ports %d-%d, logs in %s",
            len(commands),
            engine.kind,
            commands[0].port,
            commands[-1].port,
            config.work_dir / "logs",
        )
        fleet = launch_fleet(config, commands, api_key)
    try:
        benchmark_fleet(fleet, **config.engine.bench.model_dump())
        rows = [r.model_dump(mode="json") for r in fleet.report]
        open_storage(config.output).write_bytes(
            "report/fleet.json", json.dumps(rows, indent=2).encode()
        )
        healthy = sum(r.status == "healthy" for r in fleet.report)
        create_markdown_artifact(
            key=artifact_key("fleet-report", config.output),
            markdown=fleet_markdown(fleet.report),
            description=f"{dataset_name(config.output)}: fleet {healthy}/{len(rows)} healthy",
        )
        for row in fleet.report:
            logger.info("fleet %s", row.summary())
    except BaseException:
        fleet.teardown()
        raise
    return fleet


def reap_orphans(work_dir: Path) -> list[int]:
    """Stop servers whose owner died; the flow calls it first, before provisioning."""
    reaped = reap(work_dir)
    if reaped:
        get_run_logger().warning(
            "stopped %d orphan server(s) of an earlier run: pids %s", len(reaped), reaped
        )
    return reaped
