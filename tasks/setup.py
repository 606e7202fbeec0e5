"""Stages 1-3 as Prefect tasks: check, stage the model, bring the fleet up; their artifacts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.runtime import flow_run
from prefect.states import Failed, State
from pydantic import SecretStr

import regen.fleet
import regen.staging
from regen.display.figures import byte_size
from regen.display.naming import artifact
from regen.errors import FleetError
from regen.fleet import Fleet, ServerCommand
from regen.fleet.report import fleet_markdown
from regen.fleet.up import bring_up_fleet
from regen.preflight import PreflightReport, run_checks
from regen.run import OpenedRun, StagedModel


def reap_orphans(run: OpenedRun) -> list[int]:
    """Stop servers whose owner died; the flow calls it first, before provisioning."""
    if reaped := regen.fleet.reap_orphans(run.work_dir):
        get_run_logger().warning(
            "stopped %d orphan server(s) of an earlier run: pids %s", len(reaped), reaped
        )
    return reaped


@task(name="provision", persist_result=False, cache_policy=NONE)
def provision(
    run: OpenedRun, packages: Sequence[str], lease_run: str | None = None
) -> PreflightReport | State[None]:
    """Run every check (`packages`: the code the run imports, named by the flow; `lease_run`:
    the multi-node run whose lease a node shares), publish the table, and stop the run before
    a GPU is touched: a failed check ends the task Failed with the checks' lines as its
    message, returned rather than raised (an outcome, not a crash: no traceback), and the flow
    ends with it (`flows.failures.failed_with`)."""
    logger = get_run_logger()
    report = run_checks(
        run.config, packages=packages, open_output=lambda: run.storage, hf_token=run.hf_token,
        lease_run=lease_run,
    )  # fmt: skip
    verdict = "PASS" if report.ok else f"FAIL {report.summary()}"
    create_table_artifact(
        table=report.table(),
        **artifact("provisioning-checks", run.output, f"provisioning {verdict}"),
    )
    for row in report.rows:
        log = logger.error if row.status == "fail" else logger.info
        log("check %-9s %-4s %s", row.name, row.status, row.figure)
    if not report.ok:
        return Failed(message=provisioning_failed(report))
    return report


def provisioning_failed(report: PreflightReport) -> str:
    """`provisioning failed: ports: in use: [31000] (...)`: the first failed check leads; with
    several, `(+N more)` after it, then one line each."""
    lines = report.failure_lines()
    if len(lines) == 1:
        return f"provisioning failed: {lines[0]}"
    head = f"provisioning failed: {lines[0]} (+{len(lines) - 1} more)"
    return "\n".join([head, *(f"- {line}" for line in lines)])


@task(name="stage-model", retries=2, retry_delay_seconds=10, persist_result=False)
def stage_model(run: OpenedRun) -> StagedModel:
    """The directory the servers load from and the tokenizer that goes with it; a second
    staging of the same source is a no-op."""
    logger, model = get_run_logger(), run.config.model
    if not model.stage:
        logger.info("model.stage is false: servers load %s directly", model.source)
        path = Path(model.source)
    else:
        result = regen.staging.stage_model(
            model.source, model.staged_path(), revision=model.revision, hf_token=run.hf_token
        )
        if result.skipped:
            logger.info("model already staged at %s (%d files)", result.path, result.files)
        else:
            logger.info(
                "staged %d files, %s in %.1f s to %s",
                *(result.files, byte_size(result.bytes), result.seconds, result.path),
            )
        path = Path(result.path)
    # Asked once the model is in place: the staged directory is then its answer.
    return StagedModel(path, run.tokenizer())


@task(name="launch-fleet", persist_result=False, cache_policy=NONE)
def start_fleet(run: OpenedRun, model: StagedModel, api_key: SecretStr) -> Fleet | State[None]:
    """Servers that answered a real generation; the caller owns teardown (a `with` block).

    A fleet that did not come up (a server refused the key, too few became ready) ends the
    task Failed with the reason as its message and the error as its data, returned rather than
    raised (an outcome, not a crash: no traceback): the flow ends on it in one line.
    """
    logger, config = get_run_logger(), run.config

    def launching(commands: list[ServerCommand]) -> None:
        logger.info(
            "launching %d %s server(s) on ports %d-%d, logs in %s",
            *(len(commands), config.engine.kind, commands[0].port, commands[-1].port),
            commands[0].log_path.parent,
        )

    def publish(fleet: Fleet) -> None:
        healthy = f"{sum(r.status == 'healthy' for r in fleet.report)}/{len(fleet.report)}"
        create_markdown_artifact(
            markdown=fleet_markdown(fleet.report),
            **artifact("fleet-report", run.output, f"fleet {healthy} healthy"),
        )
        for row in fleet.report:
            logger.info("fleet %s", row.summary())

    # The flow run's id keys the servers' private files: a second run from this checkout
    # (another model on the node's other GPUs) shares none of them.
    try:
        return bring_up_fleet(
            config, model.path, api_key, run.storage, on_launch=launching, on_ready=publish,
            run_id=str(flow_run.id),
        )  # fmt: skip
    except FleetError as err:
        return Failed(message=str(err), data=err)
