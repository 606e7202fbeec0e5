"""What the multi-node test and bench share: the prompts, the parent's parameters, the start."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from regen.machine.ports import quiet_port_range
from support import REPO
from support.prefect import Server

PARENT = "regenerate-multinode/multinode"


def _question(i: int) -> str:
    # Long enough that the audit's tiny-length check sees a real prompt.
    return f"Explain in a few sentences what is special about the number {i}, with one fact."


def write_prompts(path: Path, rows: int) -> Path:
    """`rows` chat prompts with ids q-0000, q-0001, ..."""
    lines = (
        json.dumps({"id": f"q-{i:04d}", "messages": [{"role": "user", "content": _question(i)}]})
        for i in range(rows)
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def parent_params(
    root: Path,
    bucket: str,
    prompts: Path,
    nodes: dict[str, dict[str, Any]],
    *,
    shard_size: int,
    emulator: dict[str, Any],
    lease_s: float,
    concurrency: int = 4,
) -> dict[str, Any]:
    """`regenerate_multinode`'s parameters: one emulator per node, each node's port and work
    dir its own; `nodes` maps a node's name to the engine settings that differ on it."""
    config = {
        "model": {"source": "regen/data/emulator-model", "served_name": "emu", "stage": False},
        "engine": {
            "kind": "emulator",
            "gpus": [0],
            "startup_timeout_s": 60,
            "bench": {"concurrency": 2, "max_tokens": 16, "budget_s": 5},
            "emulator": emulator,
        },
        "prompts": str(prompts),
        "output": f"s3://{bucket}/run",
        "work_dir": str(root / "parent"),
        "shard_size": shard_size,
        "concurrency_per_server": concurrency,
    }
    entries = [
        {
            "name": name,
            "engine": {"base_port": quiet_port_range(1), **engine},
            "work_dir": str(root / name),
        }
        for name, engine in nodes.items()
    ]
    return {"config": config, "nodes": entries, "lease_s": lease_s, "poll_s": 1.0}


def start_parent(server: Server, params: dict[str, Any]) -> str:
    """`prefect deployment run` of the parent, as a user types it; the flow run's id."""
    done = server.prefect("deployment", "run", PARENT, "--params", json.dumps(params), cwd=REPO)
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", done.stdout)
    if match is None:
        raise AssertionError(f"no flow run id in:\n{done.stdout}")
    return match.group(1)
