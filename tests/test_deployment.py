"""The deployment path end to end: a real Prefect server, `prefect deploy`, a process worker.

One server, one deploy and one worker serve both tests of this module (each costs seconds of
CPU on a shared machine). Every run overrides the rehearsal's output, work dir, stage dir and
ports with temp ones, so nothing is written into the checkout the worker runs from.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.dataset import manifested_shards, read_committed
from regen.display.naming import artifact_key
from regen.fleet.orphans import pid_files
from regen.machine.owned import group_alive
from regen.machine.ports import port_is_free, quiet_port_range
from regen.storage import LocalStorage
from support import REPO
from support.prefect import Server, Worker, prefect_server, prefect_worker

DEPLOYMENT = "regenerate/rehearsal"
SERVERS = 2


@dataclass
class Stack:
    server: Server
    worker: Worker
    root: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prefect_server_home: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("deployment")
    with prefect_server(prefect_server_home) as server:
        server.prefect("work-pool", "create", "regen-cpu", "--type", "process", cwd=root)
        for pool in ("regen-gpu", "regen-gpu-node-1", "regen-gpu-node-2"):
            _create_pool(server, pool)  # only so `deploy --all` finds them; a CLI call is 5 s
        # From the checkout itself: deploy records its cwd as the flow's working directory.
        server.prefect("--no-prompt", "deploy", "--all", cwd=REPO)
        with prefect_worker(server, "regen-cpu", cwd=root, log=root / "worker.log") as worker:
            yield Stack(server, worker, root)
        assert worker.process.poll() is not None
    assert server.process.poll() is not None


def _create_pool(server: Server, name: str) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    with server.client() as client:
        client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def _run_config(root: Path, **changes: Any) -> dict[str, Any]:
    """The deployment's own rehearsal config with every writable path and port moved to `root`."""
    data = yaml.safe_load((REPO / "prefect.yaml").read_text())
    (rehearsal,) = (d for d in data["deployments"] if d["name"] == "rehearsal")
    config: dict[str, Any] = json.loads(json.dumps(rehearsal["parameters"]["config"]))
    config["output"] = str(root / "out")
    config["work_dir"] = str(root / "work")
    config["model"]["stage_dir"] = str(root / "stage")
    config["engine"]["gpus"] = list(range(SERVERS))
    config["engine"]["base_port"] = quiet_port_range(SERVERS)
    for section, values in changes.items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:
            config[section] = values
    return config


def _start_run(server: Server, config: dict[str, Any]) -> str:
    """`prefect deployment run` as a user types it; the flow run's id."""
    done = server.prefect(
        "deployment", "run", DEPLOYMENT, "--params", json.dumps({"config": config}), cwd=REPO
    )
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", done.stdout)
    assert match, done.stdout
    return match.group(1)


def _wait_state(server: Server, run_id: str, timeout: float) -> Any:
    run = server.wait_final(run_id, timeout)
    if run.state is None or not run.state.is_final():
        raise AssertionError(f"flow run {run_id} still {run.state_name} after {timeout:.0f} s")
    return run


def _task_run_names(server: Server, run_id: str) -> list[str]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with server.client() as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(run_id)]))
        )
    return sorted(r.name for r in runs)


def _artifact_keys(server: Server, run_id: str) -> set[str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with server.client() as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[uuid.UUID(run_id)])
            )
        )
    return {a.key for a in artifacts if a.key}


def _failure(stack: Stack, run: Any) -> str:
    return f"{run.state_name}: {run.state.message}\n--- worker log:\n{stack.worker.log.read_text()}"


def _server_processes(work_dir: Path) -> list[int]:
    """Process groups named by the fleet's PID files that still have a live process."""
    records = (json.loads(p.read_text()) for p in pid_files(work_dir))
    return [r["pgid"] for r in records if group_alive(r["pgid"])]


@pytest.mark.timeout(300)
def test_rehearsal_deployment_runs_to_completed(stack: Stack) -> None:
    root = stack.root / "complete"
    config = _run_config(root)
    # The deployment's own defaults must not be used: nothing may appear in the checkout.
    defaults = [REPO / "out" / "rehearsal-nightly", REPO / ".regen" / "rehearsal"]
    existed = [p.exists() for p in defaults]

    started = time.monotonic()
    run_id = _start_run(stack.server, config)
    run = _wait_state(stack.server, run_id, timeout=180)
    seconds = time.monotonic() - started
    queued = (run.end_time - run.created).total_seconds() if run.end_time and run.created else 0
    print(
        f"\n`prefect deployment run` to {run.state_name}: {seconds:.1f} s "
        f"(flow run created to end {queued:.1f} s, running {run.total_run_time})"
    )

    assert run.state.is_completed(), _failure(stack, run)
    # Named and tagged for what it does; its own dataset tag replaces the deployment's default.
    assert run.name == "rehearsal-qwen3-emu-sample-prompts"
    assert {"rehearsal", "model:qwen3-emu", "dataset:out"} <= set(run.tags)
    assert "dataset:rehearsal-nightly" not in run.tags
    names = _task_run_names(stack.server, run_id)
    for prefix in ("provision", "stage-model", "plan-shards", "launch-fleet", "audit"):
        assert any(n.startswith(prefix) for n in names), names
    assert "generate-shard-000000" in names
    assert {
        artifact_key(kind, config["output"])
        for kind in (
            "provisioning-checks",
            "fleet-report",
            "generation-progress",
            "generation-summary",
            "audit-report",
        )
    } <= _artifact_keys(stack.server, run_id)

    out = root / "out"
    found = read_committed(LocalStorage(out))
    assert found.shards and not (found.census.without_data or found.census.unusable)
    assert [f"generate-shard-{s:06d}" for s in found.shards] == sorted(
        n for n in names if n.startswith("generate-shard-")
    )
    for key in ("run.json", "plan.parquet", "progress.json", "report/audit.json"):
        assert (out / key).is_file(), key
    assert not _server_processes(root / "work")
    assert [p.exists() for p in defaults] == existed


@pytest.mark.timeout(300)
def test_cancelled_run_stops_its_servers_and_keeps_committed_shards(stack: Stack) -> None:
    from prefect.states import Cancelling

    root = stack.root / "cancel"
    # ~20 s of generation: 12 shards of 20, 8 requests in flight of ~0.7 s each (real time).
    config = _run_config(
        root,
        shard_size=20,
        concurrency_per_server=4,
        # A small canary: the default 256 would generate all 240 prompts before the first
        # shard commits, and the cancel is meant to land between shard commits.
        generation={"canary_prompts": 24},
        engine={
            "emulator": {
                "time_scale": 1.0,
                "reasoning_tokens": "100:200",
                "answer_tokens": "20:50",
            },
            "bench": {"concurrency": 2, "max_tokens": 16, "budget_s": 5},
        },
    )
    base_port = config["engine"]["base_port"]
    run_id = _start_run(stack.server, config)

    storage = LocalStorage(root / "out")
    with stack.server.client() as client:
        deadline = time.monotonic() + 150
        while not manifested_shards(storage):
            run = client.read_flow_run(uuid.UUID(run_id))
            assert run.state is not None and not run.state.is_final(), _failure(stack, run)
            assert time.monotonic() < deadline, "no shard committed in time"
            time.sleep(0.5)
    assert _server_processes(root / "work"), "the fleet should be up mid-generation"
    with stack.server.client() as client:
        client.set_flow_run_state(uuid.UUID(run_id), Cancelling())
    run = _wait_state(stack.server, run_id, timeout=90)

    assert run.state.is_cancelled(), _failure(stack, run)
    deadline = time.monotonic() + 20  # the hooks and the `with` teardown race the state report
    while _server_processes(root / "work") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _server_processes(root / "work")
    assert all(port_is_free("127.0.0.1", base_port + i) for i in range(SERVERS))
    found = read_committed(storage)
    assert not (found.census.without_data or found.census.unusable), found.census
    manifests = found.shards
    num_shards = json.loads((root / "out" / "run.json").read_text())["num_shards"]
    assert len(manifests) < num_shards, "cancelled after the last shard: make generation slower"
    progress = json.loads((root / "out" / "progress.json").read_text())
    print(f"\ncancelled with {len(manifests)} shard(s) committed; progress.json: {progress}")


def _logs(server: Server, run_id: str) -> list[str]:
    """Every log line of the run, oldest first, page by page (the API answers 200 at most)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    said: list[str] = []
    with server.client() as client:
        while page := client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[uuid.UUID(run_id)])),
            sort=LogSort.TIMESTAMP_ASC,
            offset=len(said),
        ):
            said += [log.message for log in page]
    return said


def _logs_to_the_end(server: Server, run_id: str, last: str) -> list[str]:
    """The run's logs once its `last` line has arrived: the worker ships logs in batches, so
    the final state reaches the API a moment before the line that reports it."""
    deadline = time.monotonic() + 30
    while last not in (said := _logs(server, run_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return said


def _task_states(server: Server, run_id: str) -> dict[str, Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with server.client() as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(run_id)]))
        )
    return {r.name: r.state for r in runs}


def _no_traceback(stack: Stack, run_id: str, message: str) -> None:
    """The run's logs name its reason and end with it; no traceback, Prefect's or ours."""
    last = f"Finished in state Failed({message!r})"
    said = _logs_to_the_end(stack.server, run_id, last)
    text = "\n".join(said)
    assert "Traceback" not in text and "NoneType: None" not in text, text[-4000:]
    assert "FailedRun" not in text and "Engine execution exited" not in text, text[-4000:]
    assert said[-1] == last, said[-3:]


@pytest.mark.timeout(300)
def test_a_failed_gate_ends_the_deployment_run_failed_in_its_own_words(stack: Stack) -> None:
    """Issue 38: a canary stop ends the run Failed (not Completed) with its short reason on the
    first line and a line per failing check, its shards Cancelled, and no traceback: the
    engine of a deployment's run no longer logs Prefect's `FailedRun` frames."""
    root = stack.root / "gate"
    config = _run_config(
        root,
        generation={"canary_prompts": 64},
        engine={"emulator": {"faults": ["empty-answer=0.9"]}},
    )
    run_id = _start_run(stack.server, config)
    run = _wait_state(stack.server, run_id, timeout=180)

    assert run.state.is_failed() and not run.state.is_crashed(), _failure(stack, run)
    message = run.state.message or ""
    first, *lines = message.splitlines()
    assert first.startswith("FAIL: canary gate stopped the run after 64 rows: "), message
    assert lines[0].startswith("- empty_answer ") and message.count("e.g.") == 1, message
    states = _task_states(stack.server, run_id)
    shards = [s for name, s in states.items() if name.startswith("generate-shard-")]
    assert shards and all(s.type.value == "CANCELLED" for s in shards), states
    audit = next(s for name, s in states.items() if name.startswith("audit"))
    assert audit.type.value == "FAILED" and audit.message == message
    _no_traceback(stack, run_id, message)


@pytest.mark.timeout(300)
def test_a_provisioning_failure_ends_the_deployment_run_failed_in_one_line(
    stack: Stack,
) -> None:
    """Ports in use: the run ends Failed with the check's line as its message, returned rather
    than raised (before, three `ProvisioningFailed` tracebacks filled the logs)."""
    import socket

    root = stack.root / "ports"
    config = _run_config(root)
    port = config["engine"]["base_port"]
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        run_id = _start_run(stack.server, config)
        run = _wait_state(stack.server, run_id, timeout=120)

    assert run.state.is_failed() and not run.state.is_crashed(), _failure(stack, run)
    message = run.state.message or ""
    assert message.startswith("provisioning failed: "), message
    # Its port among those in use: another test's server may hold one of the fleet's others.
    in_use = re.search(r"ports: in use: \[([\d, ]+)\] \(stop what listens there", message)
    assert in_use and port in {int(p) for p in in_use[1].split(", ")}, message
    provision = next(s for n, s in _task_states(stack.server, run_id).items() if "provision" in n)
    assert provision.type.value == "FAILED" and provision.message == message
    _no_traceback(stack, run_id, message)
    assert not (root / "work" / "runs").exists(), "nothing was launched"
