"""Notifications the Prefect way, end to end: a real `prefect server`, the rehearsal deployment
and a process worker, a custom-webhook notification block pointed at a real HTTP receiver in
this test, and `regen notify setup --block NAME` making the automations. Three runs (a clean
one, one the live gate stops, one killed with SIGKILL mid-generation) must each bring exactly
their one message, and nothing else must arrive.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from regen.dataset import manifested_shards
from regen.display.outcome import done_line
from regen.fleet.orphans import find_orphans, reap_orphans
from regen.machine.ports import quiet_port_range
from regen.storage import LocalStorage
from support import REPO
from support.prefect import Server, Worker, prefect_server, prefect_worker
from tests.support.webhook import Receiver, webhook_receiver

DEPLOYMENT = "regenerate/rehearsal"
BLOCK = "regen-test-hook"
REGEN = str(Path(sys.executable).parent / "regen")

# The block, and a sentinel automation of the test's own: a custom event it emits after the
# three runs comes out last, so every message the runs' state events caused has arrived.
_SETUP = """
import sys
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.orchestration import get_client
from prefect.events.actions import SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

block = CustomWebhookNotificationBlock(
    name="regen-test", url=sys.argv[1], json_data={"subject": "{{subject}}", "body": "{{body}}"}
)
block_id = block.save(sys.argv[2])
trigger = EventTrigger(
    expect={"regen.test.sentinel"},
    match={"prefect.resource.id": "regen.test.*"},
    posture=Posture.Reactive,
    threshold=1,
)
action = SendNotification(block_document_id=block_id, subject="sentinel", body="sentinel")
sentinel = AutomationCore(name="test: sentinel", trigger=trigger, actions=[action])
with get_client(sync_client=True) as client:
    client.create_automation(sentinel)
"""


@dataclass
class Stack:
    server: Server
    worker: Worker
    receiver: Receiver
    root: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, prefect_server_home: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("notify")
    # A generous start-up: the server shares a busy machine (its own figure is ~6 s idle).
    with webhook_receiver() as receiver, prefect_server(prefect_server_home, 240) as server:
        server.prefect("work-pool", "create", "regen-cpu", "--type", "process", cwd=root)
        server.prefect("--no-prompt", "deploy", "--name", "rehearsal", cwd=REPO)
        done = subprocess.run(
            [sys.executable, "-c", _SETUP, receiver.url, BLOCK],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        # The user's command, as the README gives it.
        setup = subprocess.run(
            [REGEN, "notify", "setup", "--block", BLOCK],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert setup.returncode == 0, setup.stderr
        print(f"\n$ regen notify setup --block {BLOCK}\n{setup.stdout}")
        assert len(setup.stdout.strip().splitlines()) == 4, setup.stdout
        with prefect_worker(server, "regen-cpu", cwd=root, log=root / "worker.log") as worker:
            yield Stack(server, worker, receiver, root)


def _config(root: Path, **changes: Any) -> dict[str, Any]:
    """The deployment's rehearsal config, its paths and ports moved under `root`."""
    data = yaml.safe_load((REPO / "prefect.yaml").read_text())
    (rehearsal,) = (d for d in data["deployments"] if d["name"] == "rehearsal")
    config: dict[str, Any] = json.loads(json.dumps(rehearsal["parameters"]["config"]))
    config.update(output=str(root / "out"), work_dir=str(root / "work"))
    config["model"]["stage_dir"] = str(root / "stage")
    config["engine"].update(gpus=[0, 1], base_port=quiet_port_range(2))
    for section, values in changes.items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:
            config[section] = values
    return config


def _start(stack: Stack, config: dict[str, Any]) -> str:
    done = stack.server.prefect(
        "deployment", "run", DEPLOYMENT, "--params", json.dumps({"config": config}), cwd=REPO
    )
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", done.stdout)
    assert match, done.stdout
    return match.group(1)


def _final(stack: Stack, run_id: str, timeout: float = 240) -> Any:
    run = stack.server.wait_final(run_id, timeout)
    assert run.state is not None and run.state.is_final(), (
        f"{run.state_name} after {timeout:.0f} s\n{stack.worker.log.read_text()[-3000:]}"
    )
    return run


def _kill_flow_run(stack: Stack, run_id: str) -> None:
    """SIGKILL to the flow run's process, as the OOM killer would: no hook runs in it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for proc in psutil.Process(stack.worker.process.pid).children(recursive=True):
            try:
                if proc.environ().get("PREFECT__FLOW_RUN_ID") == run_id:
                    proc.kill()
                    return
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no process of flow run {run_id} under the worker")


def _emit_sentinel(server: Server) -> None:
    event = {
        "id": str(uuid.uuid4()),
        "occurred": datetime.now(UTC).isoformat(),
        "event": "regen.test.sentinel",
        "resource": {"prefect.resource.id": "regen.test.sentinel"},
    }
    request = urllib.request.Request(
        f"{server.api_url}/events",
        data=json.dumps([event]).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 204


@pytest.mark.timeout(900)
def test_a_clean_run_a_gate_stop_and_a_crash_each_bring_exactly_their_message(
    stack: Stack,
) -> None:
    receiver, expected = stack.receiver, []

    clean = _config(stack.root / "clean")
    run = _final(stack, _start(stack, clean))
    assert run.state.is_completed(), run.state.message
    out = clean["output"]
    assert run.state.message == done_line(out, rows_ok=240, rows_failed=0, verdict="pass"), (
        "the run's one line"
    )
    expected.append(
        {"subject": f"regen: {run.name} done", "body": f"{run.name}: {run.state.message}"}
    )
    assert receiver.wait_for(len(expected), 120) == expected

    stop = _config(
        stack.root / "stop",
        generation={"canary_prompts": 64},
        engine={"emulator": {"faults": ["empty-answer=0.9"]}},
    )
    run = _final(stack, _start(stack, stop))
    said = (run.state.message or "").strip().splitlines()
    assert run.state.is_failed() and said[0].startswith("FAIL: canary gate stopped the run")
    assert said[-1].startswith("The data was kept: 0 committed rows at ")
    expected.append(
        {
            "subject": f"regen: {run.name} stopped by the live gate",
            "body": f"{run.name}: {said[0].removeprefix('FAIL: ')}. {said[-1]}. Fix the cause "
            "(the report names the rows), then rerun with generation.new_output: true; rerun "
            "unchanged, it is refused.",
        }
    )
    assert receiver.wait_for(len(expected), 120) == expected

    # ~20 s of generation, killed once a shard is committed (as the cancel test paces it).
    crash = _config(
        stack.root / "crash",
        shard_size=20,
        concurrency_per_server=4,
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
    run_id = _start(stack, crash)
    storage = LocalStorage(Path(crash["output"]))
    deadline = time.monotonic() + 180
    while not manifested_shards(storage):
        assert time.monotonic() < deadline, "no shard committed in time"
        time.sleep(0.5)
    try:
        _kill_flow_run(stack, run_id)
        run = _final(stack, run_id)
    finally:
        reap_orphans(Path(crash["work_dir"]))
    assert run.state.is_crashed(), run.state_name
    assert not find_orphans(Path(crash["work_dir"])), "its servers were stopped"
    kept = crash["output"]
    expected.append(
        {
            "subject": f"regen: {run.name} crashed",
            "body": f"{run.name} crashed: {run.state.message} The shards committed before it "
            f"are kept in {kept} (`regen status {kept}` counts them); run it again to resume.",
        }
    )
    assert receiver.wait_for(len(expected), 120) == expected

    _emit_sentinel(stack.server)
    sentinel = {"subject": "sentinel", "body": "sentinel"}
    got = receiver.wait_for(len(expected) + 1, 120)
    print("\nthe webhook receiver's messages:")
    for message in got:
        print(json.dumps(message))
    assert got == [*expected, sentinel], "exactly one message a run, and no other"
