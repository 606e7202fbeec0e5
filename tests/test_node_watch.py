"""The parent's decisions in a multi-node run (`regen.multinode.watch`), without Prefect:
children's states are plain `ChildState`s, heartbeats and manifests real files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl

from regen.config import parse_config
from regen.dataset import commit_shard
from regen.dataset.keys import heartbeat_key
from regen.multinode.nodes import NodeAssignment, NodeConfig
from regen.multinode.watch import (
    NOT_NEEDED,
    ChildState,
    NodeOutcome,
    NodesReport,
    child_parameters,
    node_end,
    problem,
    watch,
)
from regen.rehearsal import bundled
from regen.schema import row_schema
from regen.storage import LocalStorage, Storage

FP = "watch-run"
RUNNING = ChildState("Running", None, final=False, completed=False, running=True)
PENDING = ChildState("Pending", None, final=False, completed=False, running=False)
DONE = ChildState("Completed", None, final=True, completed=True, running=False)
FAILED = ChildState("Failed", "shard 3 failed", final=True, completed=False, running=False)


def beat(storage: Storage, node: str, age_s: float, *, done: bool = False) -> None:
    body: dict[str, object] = {"node": node, "at": time.time() - age_s}
    if done:
        body["done"] = "true"
    storage.write_bytes(heartbeat_key(node), json.dumps(body).encode())


def commit(storage: Storage, shard: int, node: str) -> None:
    """A one-row shard of this run, committed by `node`."""
    columns = {name: pl.lit(None, dtype) for name, dtype in row_schema().items()}
    rows = pl.select(*(e.alias(n) for n, e in columns.items())).with_columns(
        id=pl.lit(f"s{shard}"), shard=pl.lit(shard)
    )
    commit_shard(storage, shard, rows, fingerprint=FP, timings={}, node=node)


def test_problem_names_a_failed_end_and_a_stale_heartbeat() -> None:
    assert problem(None, None, 30) is None
    assert problem(DONE, 999, 30) is None
    assert problem(FAILED, None, 30) == "Failed: shard 3 failed"
    assert problem(RUNNING, 29.0, 30) is None
    assert problem(RUNNING, None, 30) is None, "never beat, or said it was done"
    assert problem(RUNNING, 31.0, 30) == "vanished: no heartbeat for 31 s"


def test_watch_ends_when_no_node_works_and_says_what_became_of_each(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    commit(storage, 0, "a")
    beat(storage, "a", 0, done=True)
    beat(storage, "b", 100)  # b's machine died long ago
    states = {"a": DONE, "b": RUNNING}
    polls: list[int] = []
    watched = watch(
        storage, FP, 2, lambda: dict(states), lease_s=30, poll_s=0.01,
        on_poll=lambda tally: polls.append(tally.rows),
    )  # fmt: skip
    assert polls == [1], "nobody works: one look is enough"
    assert not watched.tally.complete
    a, b = node_end(watched, "a", 30), node_end(watched, "b", 30)
    assert (a.problem, a.note, a.stop) == (None, None, None)
    assert b.stop == "crashed" and b.problem == "vanished: no heartbeat for 100 s"


def test_watch_waits_for_the_dataset_then_cancels_nodes_not_needed(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    beat(storage, "a", 0)
    states = {"a": RUNNING, "b": RUNNING, "c": PENDING}
    looks = 0

    def read() -> dict[str, ChildState | None]:
        nonlocal looks
        looks += 1
        if looks == 3:  # a commits the last shards and ends
            commit(storage, 0, "a")
            commit(storage, 1, "a")
            states["a"] = DONE
        return dict(states)

    start = time.monotonic()
    watched = watch(storage, FP, 2, read, lease_s=0.3, poll_s=0.01)
    assert watched.tally.complete and looks > 3
    assert time.monotonic() - start >= 0.3, "b and c get a lease to wind down"
    assert node_end(watched, "b", 0.3).stop == "cancelling"
    c = node_end(watched, "c", 0.3)
    assert (c.stop, c.note, c.problem) == ("cancelled", NOT_NEEDED, None)
    assert watched.tally.by_node() == {"a": (2, 2)}


def test_nodes_report_markdown_names_each_node_and_the_verdict() -> None:
    report = NodesReport(
        complete=False,
        nodes=[
            NodeOutcome(name="a", flow_run_id="1", state="Completed", shards=3, rows=9),
            NodeOutcome(
                name="b", flow_run_id="2", state="Crashed", shards=0, rows=0, problem="vanished"
            ),
        ],
    )
    assert report.failed == ["b"]
    text = report.to_markdown()
    assert "dataset INCOMPLETE: run again to resume" in text
    assert "| a | Completed | 3 | 9 |  |" in text and "| b | Crashed | 0 | 0 | vanished |" in text


def test_child_parameters_carry_config_assignment_and_named_blocks_only(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    config = parse_config(
        {
            "model": {"source": str(bundled("emulator-model")), "served_name": "m"},
            "prompts": str(prompts),
            "output": str(tmp_path / "out"),
            "engine": {"kind": "emulator", "gpus": [0], "api_key": "sk-very-secret"},
        },
        "test",
    )
    assignment = NodeAssignment(name="b", ranges={"b": [0]}, weights={"b": 1.0}, lease_s=60)
    node = NodeConfig(name="b", fleet_block="fleet-b", engine={"gpus": [0, 1]})
    blocks = {"model_block": "qwen", "storage_block": None, "api_key_secret": None}
    params = child_parameters(node, config, assignment, blocks)
    assert set(params) == {"config", "node", "fleet_block", "model_block"}, "no None values"
    assert params["config"]["engine"]["gpus"] == [0, 1]
    assert params["node"] == assignment.model_dump(mode="json")
    assert params["fleet_block"] == "fleet-b" and params["model_block"] == "qwen"
    assert "sk-very-secret" not in repr(params), "a node loads its key itself"
    plain = child_parameters(NodeConfig(name="a"), config, assignment, {})
    assert "fleet_block" not in plain
