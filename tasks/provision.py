"""Stage 1 as a Prefect task: the provisioning table artifact, and a Failed state on any fail."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from regen.config import RegenConfig
from regen.errors import UserError
from regen.naming import artifact_key, dataset_name
from regen.preflight import PreflightReport, run_checks

_LOUD = {"fail": 0, "warn": 1}


class ProvisioningFailed(UserError):
    """A check failed: nothing was staged or launched."""


@task(name="provision", persist_result=False)
def provision(config: RegenConfig, packages: Sequence[str]) -> PreflightReport:
    """Run every check (`packages`: the code the run imports, named by the flow), publish the
    table, and stop the run before a GPU is touched."""
    logger = get_run_logger()
    report = run_checks(config, packages=packages)
    create_table_artifact(
        key=artifact_key("provisioning-checks", config.output),
        # Failures and warnings first, in capitals: they are what the reader came for.
        table=[
            {**r.model_dump(), "status": r.status.upper() if r.status in _LOUD else r.status}
            for r in sorted(report.rows, key=lambda r: _LOUD.get(r.status, len(_LOUD)))
        ],
        description=f"{dataset_name(config.output)}: provisioning "
        + ("PASS" if report.ok else f"FAIL {report.summary()}"),
    )
    for row in report.rows:
        log = logger.error if row.status == "fail" else logger.info
        log("check %-9s %-4s %s", row.name, row.status, row.figure)
    if not report.ok:
        raise ProvisioningFailed(f"provisioning failed: {report.summary()}")
    return report
