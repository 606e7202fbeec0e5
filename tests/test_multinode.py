"""Two GPU "nodes" on this machine: a real Prefect server, one process work pool and worker per
node plus one for the parent, each child with its own emulator fleet, the dataset on moto S3.

One server, one deploy and one set of workers serve the module; the killed-worker test runs
last because it kills node-2's worker. A node whose fleet is gone (its servers killed, its
worker alive) stops alone and the other completes the dataset. The parent is started as a user
starts it, with `prefect deployment run regenerate-multinode/multinode`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import pytest

from regen.dataset import read_committed
from regen.display.naming import artifact_key
from regen.fleet import reap_orphans
from regen.generation.loop import shards_in_flight
from regen.storage import Storage
from support import REPO
from support.chaos import kill_servers, server_records, surviving_servers
from support.multinode import parent_params, start_parent, write_prompts
from support.prefect import Server, Worker, prefect_server, prefect_worker, stop_worker
from support.s3 import MotoS3, moto_server

pytestmark = pytest.mark.timeout(600)

POOLS = ("regen-cpu", "regen-gpu", "regen-gpu-node-1", "regen-gpu-node-2")
NODES = ("node-1", "node-2")


@dataclass
class Cluster:
    server: Server
    s3: MotoS3
    workers: dict[str, Worker]
    root: Path


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, prefect_server_home: Path
) -> Iterator[Cluster]:
    from prefect.client.schemas.actions import WorkPoolCreate

    root = tmp_path_factory.mktemp("multinode")
    with moto_server() as s3, prefect_server(prefect_server_home) as server:
        with server.client() as client:
            for pool in POOLS:  # one API call each; `prefect work-pool create` costs seconds
                client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        server.prefect("--no-prompt", "deploy", "--all", cwd=REPO)
        workers: dict[str, Worker] = {}
        with (
            prefect_worker(server, "regen-cpu", root, root / "parent.log", s3.env) as parent,
            prefect_worker(server, POOLS[2], root, root / "node-1.log", s3.env) as one,
            prefect_worker(server, POOLS[3], root, root / "node-2.log", s3.env) as two,
        ):
            workers.update({"parent": parent, "node-1": one, "node-2": two})
            yield Cluster(server, s3, workers, root)


def _params(
    cluster: Cluster,
    name: str,
    *,
    rows: int,
    shard_size: int,
    slow: float = 1.0,
    lease_s: float = 6.0,
    tokens_per_s: float = 500.0,
) -> tuple[dict[str, Any], str]:
    """The parent's parameters for one run, every path and port of its own; and its bucket."""
    root = cluster.root / name
    root.mkdir()
    bucket = cluster.s3.create_bucket()
    emulator = {
        "time_scale": 1.0,
        "tokens_per_s": tokens_per_s,
        "reasoning_tokens": "30:60",
        "answer_tokens": "40:80",
    }
    nodes: dict[str, dict[str, Any]] = {node: {} for node in NODES}
    if slow != 1.0:
        nodes["node-2"] = {"emulator": {"time_scale": slow}}
    prompts = write_prompts(root / "prompts.jsonl", rows)
    params = parent_params(
        root, bucket, prompts, nodes, shard_size=shard_size, emulator=emulator, lease_s=lease_s
    )
    return params, bucket


def _wait_final(cluster: Cluster, run_id: str, timeout: float) -> Any:
    run = cluster.server.wait_final(run_id, timeout, poll_s=1)
    if run.state is None or not run.state.is_final():
        raise AssertionError(
            f"{run_id} still {run.state_name} after {timeout:.0f} s\n{_logs(cluster)}"
        )
    return run


def _logs(cluster: Cluster) -> str:
    return "\n".join(
        f"--- {name} worker:\n{w.log.read_text()[-6000:]}" for name, w in cluster.workers.items()
    )


def _children(cluster: Cluster, run_id: str) -> dict[str, Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with cluster.server.client() as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[uuid.UUID(run_id)])
            )
        )
    return {r.parameters["node"]["name"]: r for r in runs}


def _artifact(cluster: Cluster, run_id: str, kind: str, bucket: str) -> Any:
    """The run's artifact of `kind` for the dataset s3://<bucket>/run (keys carry its slug)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    key = artifact_key(kind, f"s3://{bucket}/run")
    with cluster.server.client() as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[uuid.UUID(run_id)])
            )
        )
    found = [a for a in artifacts if a.key == key]
    assert found, (key, [a.key for a in artifacts])
    return found[0]


def _dataset(storage: Storage) -> tuple[pl.DataFrame, dict[int, Any]]:
    found = read_committed(storage, verify=True)  # of run.json's fingerprint
    return found.collect(), found.manifests


def _assert_exactly_once(storage: Storage, rows: int) -> dict[int, Any]:
    data, manifests = _dataset(storage)
    expected = [f"q-{i:04d}" for i in range(rows)]
    assert sorted(data["id"].to_list()) == expected, "an id is missing or appears twice"
    assert data["error"].null_count() == data.height
    return manifests


def test_two_nodes_write_every_id_once_as_two_subflows(cluster: Cluster) -> None:
    rows = 240
    # ~1 s a request: one node alone would need a minute, so a node whose fleet comes up
    # late on a loaded machine still finds shards left (a faster one would take them all).
    params, bucket = _params(cluster, "even", rows=rows, shard_size=10, tokens_per_s=100.0)
    run_id = start_parent(cluster.server, params)
    run = _wait_final(cluster, run_id, timeout=300)
    assert run.state.is_completed(), f"{run.state_name}: {run.state.message}\n{_logs(cluster)}"

    children = _children(cluster, run_id)
    assert set(children) == set(NODES)
    assert all(c.state.is_completed() for c in children.values()), {
        n: c.state_name for n, c in children.items()
    }
    storage = cluster.s3.storage(bucket, "run")
    manifests = _assert_exactly_once(storage, rows)
    by_node = {node: sum(m.node == node for m in manifests.values()) for node in NODES}
    assert all(by_node.values()), f"a node generated nothing: {by_node}"
    assert sum(by_node.values()) == len(manifests) == 24
    assert storage.exists("report/audit.json"), "the parent audits the whole dataset once"
    for node in NODES:
        assert storage.exists(f"nodes/{node}.progress.json")
    nodes = _artifact(cluster, run_id, "multinode-nodes", bucket)
    assert all(node in nodes.data for node in NODES) and "complete" in nodes.data
    assert (nodes.description or "").startswith("complete · "), nodes.description
    # The card leads with its figure: the share and the rows committed, both counts the same.
    said = _artifact(cluster, run_id, "multinode-progress", bucket).description or ""
    assert re.match(r"^100 % · ([\d,]+) / \1 rows committed · ", said), said
    print(f"\nshards per node: {by_node}")


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _ideal_ratio(manifests: dict[int, Any]) -> tuple[float, dict[str, float]]:
    """Wall time over the ideal split's, from the manifests' commit times.

    Each node's rate is its rows over its own span (first shard started to last committed),
    so a node that started late is not counted against the balance. The ideal end T solves
    sum(rate * (T - start)) = rows: the time both nodes would need had neither idled.
    """
    spans: dict[str, list[float]] = {}
    rows: dict[str, int] = {}
    for m in manifests.values():
        end = _stamp(m.written_at)
        start = end - m.timings["generate_s"]
        lo, hi = spans.get(m.node, [start, end])
        spans[m.node] = [min(lo, start), max(hi, end)]
        rows[m.node] = rows.get(m.node, 0) + m.rows
    rates = {n: rows[n] / (hi - lo) for n, (lo, hi) in spans.items()}
    first = min(lo for lo, _ in spans.values())
    wall = max(hi for _, hi in spans.values()) - first
    # Nodes' rates are constant, so T is found by bisection over [first, first + 2 * wall].
    lo_t, hi_t = first, first + 2 * wall
    total = sum(rows.values())
    for _ in range(60):
        mid = (lo_t + hi_t) / 2
        done = sum(rates[n] * max(0.0, mid - spans[n][0]) for n in rates)
        lo_t, hi_t = (mid, hi_t) if done < total else (lo_t, mid)
    return wall / (hi_t - first), rates


def _commits_after_the_first_ran_dry(manifests: dict[int, Any]) -> int:
    """Shards committed after the last commit of the node that finished first."""
    last: dict[str, float] = {}
    for m in manifests.values():
        last[m.node] = max(last.get(m.node, 0.0), _stamp(m.written_at))
    dry = min(last.values())
    return sum(_stamp(m.written_at) > dry for m in manifests.values())


def test_a_twice_slower_node_gets_fewer_shards_and_the_wall_stays_near_ideal(
    cluster: Cluster,
) -> None:
    rows = 300
    # Slow emulated decoding (~1 s a request), so simulated time, not this machine's CPU,
    # sets each node's speed and node-2 is really twice as slow.
    params, bucket = _params(cluster, "slow", rows=rows, shard_size=5, slow=2.0, tokens_per_s=100.0)
    run_id = start_parent(cluster.server, params)
    run = _wait_final(cluster, run_id, timeout=400)
    assert run.state.is_completed(), f"{run.state_name}: {run.state.message}\n{_logs(cluster)}"

    manifests = _assert_exactly_once(cluster.s3.storage(bucket, "run"), rows)
    by_node = {node: sum(m.node == node for m in manifests.values()) for node in NODES}
    ratio, rates = _ideal_ratio(manifests)
    print(
        f"\nslow node: shards {by_node}, rows/s { ({n: round(r, 1) for n, r in rates.items()}) }, "
        f"wall / ideal split {ratio:.3f}"
    )
    assert by_node["node-2"] < by_node["node-1"], by_node
    # Near ideal, read from the order of commits rather than the clock (a loaded machine
    # stretches both): once the first node to run dry has committed its last shard, every
    # shard is claimed, so the other commits what it holds in flight (`window`), and at most
    # as many again taken over from a lease that ran out under load. Nodes that each kept
    # their own half (no taking over: here about 15 left to the slow node), or a node idle
    # while shards waited, would leave the other committing many more.
    window = shards_in_flight(slots=1 * 4, shard_size=5)  # parent_params: 1 server x 4
    assert _commits_after_the_first_ran_dry(manifests) <= 2 * window, (by_node, ratio)


def test_the_parent_audits_an_s3_model_with_its_tokenizer(cluster: Cluster) -> None:
    # The parent stages no model: it once audited an s3:// or hf:// model without its chat
    # template, so the loss-mask and template-parity checks were skipped there. It now
    # fetches the tokenizer files alone.
    params, bucket = _params(cluster, "s3-model", rows=20, shard_size=10)
    client = cluster.s3.client()
    for path in (REPO / "regen" / "data" / "emulator-model").iterdir():
        client.put_object(Bucket=bucket, Key=f"models/emu/{path.name}", Body=path.read_bytes())
    root = cluster.root / "s3-model"
    params["config"]["model"] = {
        "source": f"s3://{bucket}/models/emu",
        "served_name": "emu",
        "stage_dir": str(root / "parent-stage"),  # never written: the parent stages nothing
    }
    for node in params["nodes"]:
        node["stage_dir"] = str(root / f"{node['name']}-stage")
    run = _wait_final(cluster, start_parent(cluster.server, params), timeout=300)
    assert run.state.is_completed(), f"{run.state_name}: {run.state.message}\n{_logs(cluster)}"

    report = json.loads(cluster.s3.storage(bucket, "run").read_bytes("report/audit.json"))
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["template_parity"]["status"] == "pass", checks["template_parity"]
    assert checks["loss_mask"]["status"] != "skipped", checks["loss_mask"]
    fetched = root / "parent" / "tokenizer"
    assert (fetched / "tokenizer.json").is_file() and not (fetched / "model.safetensors").exists()
    assert not (root / "parent-stage").exists()


def _node_committed_and_holds_more(storage: Storage, node: str) -> bool:
    """The node has committed a shard and holds others: it is mid-generation."""
    if not storage.exists(f"nodes/{node}.json"):
        return False
    held = json.loads(storage.read_bytes(f"nodes/{node}.json")).get("held", [])
    manifests = [k for k in storage.list("shards/") if k.endswith(".json")]
    return bool(held) and any(
        json.loads(storage.read_bytes(k)).get("node") == node for k in manifests
    )


def test_a_node_whose_fleet_is_gone_stops_alone_and_the_other_finishes(cluster: Cluster) -> None:
    """Before, one node's dead fleet failed every shard it claimed, one by one, and the run
    ended with both nodes failed; now that node stops at once, its claims released, and the
    other takes its shards and completes the dataset."""
    rows = 200
    params, bucket = _params(
        cluster, "gone", rows=rows, shard_size=5, lease_s=6.0, tokens_per_s=250.0
    )
    # Relaunch off: a server that exits is out at once, and with it the node's one-server fleet.
    params["config"]["engine"]["relaunch"] = {"max_restarts": 0}
    storage = cluster.s3.storage(bucket, "run")
    work_dir = cluster.root / "gone" / "node-2"
    log = cluster.workers["node-2"].log
    said_before = log.stat().st_size
    run_id = start_parent(cluster.server, params)
    deadline = time.monotonic() + 240
    while not _node_committed_and_holds_more(storage, "node-2"):
        assert time.monotonic() < deadline, f"node-2 never got going\n{_logs(cluster)}"
        time.sleep(0.3)
    servers = server_records(work_dir)
    assert servers, "node-2 runs no server"
    kill_servers(servers)  # its only server, with SIGKILL: its worker and flow run live on
    killed_at = time.time()

    run = _wait_final(cluster, run_id, timeout=300)
    assert run.state.is_completed(), f"{run.state_name}: {run.state.message}\n{_logs(cluster)}"
    manifests = _assert_exactly_once(storage, rows)
    taken_over = [
        s for s, m in manifests.items() if m.node == "node-1" and _stamp(m.written_at) > killed_at
    ]
    assert taken_over, "node-1 committed nothing after node-2's fleet died"
    children = _children(cluster, run_id)
    assert children["node-1"].state.is_completed(), children["node-1"].state
    stopped = children["node-2"].state
    assert stopped.is_failed() and not stopped.is_crashed(), stopped
    message = stopped.message or ""
    assert "; node node-2 stopped and left its unfinished shards to the other nodes; " in message
    assert re.search(r"\d+ of 40 shards committed \(", message), message
    table = _artifact(cluster, run_id, "multinode-nodes", bucket).data
    assert re.search(r"\| node-2 \|[^\n]*node node-2 stopped", table), table
    assert surviving_servers(servers) == [], "node-2's servers outlived its stop"
    said = log.read_bytes()[said_before:].decode(errors="replace")
    assert "Traceback" not in said and "Encountered exception" not in said, said[-6000:]
    failed_shards = re.findall(r"'generate-shard-\d{6}' - Finished in state Failed", said)
    assert not failed_shards, said[-6000:]
    print(f"\nnode-2 stopped: {message}\nnode-1 took over {len(taken_over)} shard(s)")


def test_when_every_nodes_fleet_is_gone_the_parent_fails_in_a_line_per_node(
    cluster: Cluster,
) -> None:
    """No node left working and the dataset incomplete: the parent ends Failed, returned (no
    traceback), its headline then each node's own line; the committed shards stay."""
    params, bucket = _params(cluster, "all-gone", rows=200, shard_size=5, tokens_per_s=250.0)
    params["config"]["engine"]["relaunch"] = {"max_restarts": 0}
    storage = cluster.s3.storage(bucket, "run")
    run_id = start_parent(cluster.server, params)
    deadline = time.monotonic() + 240
    servers: dict[str, list[dict[str, Any]]] = {}
    while len(servers) < len(NODES):
        for node in NODES:
            found = server_records(cluster.root / "all-gone" / node)
            if found and node not in servers and _node_committed_and_holds_more(storage, node):
                servers[node] = found
                kill_servers(found)
        assert time.monotonic() < deadline, f"{servers} got going\n{_logs(cluster)}"
        time.sleep(0.3)

    run = _wait_final(cluster, run_id, timeout=300)
    assert run.state.is_failed() and not run.state.is_crashed(), run.state
    lines = (run.state.message or "").splitlines()
    assert lines[0].startswith("dataset incomplete: node(s) node-1, node-2 failed"), lines
    for node, line in zip(NODES, lines[1:], strict=True):
        assert line.startswith(f"- {node}: Failed: "), line
        assert f"; node {node} stopped and left its unfinished shards to the other" in line
    data, _ = _dataset(storage)
    assert data["id"].n_unique() == data.height > 0, "committed shards are kept, each id once"
    for found in servers.values():
        assert surviving_servers(found) == []


def _kill_node(cluster: Cluster, node: str, work_dir: Path) -> None:
    """The node's machine is gone: its worker, the flow run under it and its servers."""
    worker = cluster.workers[node]
    # The flow run's process has a session of its own, so the worker's group is not enough.
    tree = [worker.process.pid, *(p.pid for p in psutil.Process(worker.process.pid).children(True))]
    for pid in tree:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    worker.process.wait(timeout=10)
    reap_orphans(work_dir)  # the servers run in process groups of their own too


def test_a_killed_node_leaves_its_shards_to_the_other_after_the_lease(cluster: Cluster) -> None:
    rows = 200
    # Half the default speed: node-1 alone must not finish all 40 shards (about 35 s at full
    # speed on an idle box) before node-2's worker has picked its run up and launched.
    params, bucket = _params(
        cluster, "killed", rows=rows, shard_size=5, lease_s=6.0, tokens_per_s=250.0
    )
    storage = cluster.s3.storage(bucket, "run")
    run_id = start_parent(cluster.server, params)
    deadline = time.monotonic() + 240
    while True:  # kill node-2 once it has committed a shard and holds more
        held = []
        if storage.exists("nodes/node-2.json"):
            held = json.loads(storage.read_bytes("nodes/node-2.json")).get("held", [])
        mine = [k for k in storage.list("shards/") if k.endswith(".json")]
        if (
            held
            and mine
            and any(json.loads(storage.read_bytes(k)).get("node") == "node-2" for k in mine)
        ):
            break
        assert time.monotonic() < deadline, f"node-2 never got going\n{_logs(cluster)}"
        time.sleep(0.3)
    _kill_node(cluster, "node-2", cluster.root / "killed" / "node-2")
    killed_at = time.time()

    run = _wait_final(cluster, run_id, timeout=300)
    assert run.state.is_completed(), f"{run.state_name}: {run.state.message}\n{_logs(cluster)}"
    manifests = _assert_exactly_once(storage, rows)
    taken_over = [
        s for s, m in manifests.items() if m.node == "node-1" and _stamp(m.written_at) > killed_at
    ]
    assert taken_over, "node-1 committed nothing after node-2 died"
    children = _children(cluster, run_id)
    assert children["node-2"].state.is_crashed(), children["node-2"].state_name
    assert "vanished" in (children["node-2"].state.message or ""), children["node-2"].state
    table = _artifact(cluster, run_id, "multinode-nodes", bucket).data
    assert re.search(r"\| node-2 \|[^\n]*vanished", table), table
    print(f"\nafter the kill node-1 committed {len(taken_over)} shard(s); {table}")
    stop_worker(cluster.workers["node-2"])
