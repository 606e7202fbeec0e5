"""prefect.yaml: each deployment names a real flow and pool, a valid schedule and config."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.config import parse_config
from support import REPO


@pytest.fixture(scope="module")
def deployments() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load((REPO / "prefect.yaml").read_text())
    return {d["name"]: d for d in data["deployments"]}


def _flow(entrypoint: str) -> Any:
    from prefect.flows import load_flow_from_entrypoint

    path, func = entrypoint.split(":")
    return load_flow_from_entrypoint(f"{REPO / path}:{func}")


def test_the_three_deployments_exist(deployments: dict[str, dict[str, Any]]) -> None:
    assert set(deployments) == {
        "rehearsal",
        "gpu-node",
        "multinode",
        "node-1",
        "node-2",
        "dataset",
        "trainer-files",
    }


@pytest.mark.parametrize(
    ("name", "flow_name", "pool"),
    [
        ("rehearsal", "regenerate", "regen-cpu"),
        ("gpu-node", "regenerate", "regen-gpu"),
        ("multinode", "regenerate-multinode", "regen-cpu"),
        ("node-1", "regenerate", "regen-gpu-node-1"),
        ("node-2", "regenerate", "regen-gpu-node-2"),
        ("dataset", "audit", "regen-cpu"),
        ("trainer-files", "export", "regen-cpu"),
    ],
)
def test_entrypoint_is_a_flow_that_takes_the_parameters(
    deployments: dict[str, dict[str, Any]], name: str, flow_name: str, pool: str
) -> None:
    deployment = deployments[name]
    flow = _flow(deployment["entrypoint"])

    assert flow.name == flow_name
    assert deployment["work_pool"]["name"] == pool
    accepted = set(inspect.signature(flow.fn).parameters)
    assert set(deployment.get("parameters", {})) <= accepted


def test_multinode_nodes_each_have_their_deployment(
    deployments: dict[str, dict[str, Any]],
) -> None:
    from regen.multinode.nodes import NodeConfig, check_nodes

    params = deployments["multinode"]["parameters"]
    nodes = [NodeConfig.model_validate(n) for n in params["nodes"]]
    configs = check_nodes(parse_config(params["config"]), nodes)
    for node in nodes:
        flow_name, name = node.deployment_name.split("/")
        assert flow_name == "regenerate" and name in deployments, node.deployment_name
        assert deployments[name]["work_pool"]["name"] == f"regen-gpu-{node.name}"
        assert configs[node.name].engine.kind == "sglang"


@pytest.mark.parametrize("name", ["rehearsal", "gpu-node", "multinode"])
def test_config_parameter_validates(deployments: dict[str, dict[str, Any]], name: str) -> None:
    config = parse_config(deployments[name]["parameters"]["config"], f"prefect.yaml:{name}")
    assert config.engine.kind == ("emulator" if name == "rehearsal" else "sglang")


def test_rehearsal_paths_stay_inside_the_checkout(deployments: dict[str, dict[str, Any]]) -> None:
    # The worker runs from the directory `prefect deploy` ran in: relative paths land there.
    config = parse_config(deployments["rehearsal"]["parameters"]["config"])
    assert (REPO / config.prompts).is_file()
    assert (REPO / config.model.source).is_dir()
    for path in (config.output, config.work_dir, config.model.stage_dir):
        assert not Path(str(path)).is_absolute()


@pytest.mark.parametrize(("name", "active"), [("rehearsal", True), ("gpu-node", False)])
def test_schedules(deployments: dict[str, dict[str, Any]], name: str, active: bool) -> None:
    from prefect.client.schemas.schedules import CronSchedule

    (schedule,) = deployments[name]["schedules"]
    cron = CronSchedule(cron=schedule["cron"], timezone=schedule.get("timezone"))

    assert cron.timezone == "UTC"
    assert schedule.get("active", True) is active


def test_a_bad_cron_is_caught() -> None:
    from prefect.client.schemas.schedules import CronSchedule

    with pytest.raises(ValueError, match="cron"):
        CronSchedule(cron="0 3 * *")
