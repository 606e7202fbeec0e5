"""Configs for fleet tests: emulator or sglang kind, free consecutive ports, a tmp work dir."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from regen.config import RegenConfig, parse_config
from regen.fleet.process import FLEET_ID_ENV
from regen.machine.ports import quiet_port_range
from support.emulator import MODEL_DIR

SERVED = "qwen3-emu"


def fleet_config(
    work_dir: Path,
    servers: int = 1,
    *,
    kind: str = "emulator",
    server_faults: dict[int, list[str]] | None = None,
    engine: dict[str, Any] | None = None,
) -> RegenConfig:
    """A config whose servers start in well under a second of simulated time."""
    base = quiet_port_range(servers)
    return parse_config(
        {
            "model": {"source": str(MODEL_DIR), "served_name": SERVED, "stage": False},
            "prompts": str(work_dir / "prompts.jsonl"),
            "output": str(work_dir / "out"),
            "work_dir": str(work_dir / "work"),
            "engine": {
                "kind": kind,
                "python": sys.executable,
                "gpus": list(range(servers)),
                "base_port": base,
                "startup_timeout_s": 30,
                "emulator": {
                    "load_s": 0.2,
                    "time_scale": 0.01,
                    "reasoning_tokens": "20:60",
                    "answer_tokens": "5:20",
                    "server_faults": server_faults or {},
                },
                **(engine or {}),
            },
        }
    )


def start_owner(
    tmp_path: Path, config: RegenConfig, script: str
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Run `script` (which launches a fleet from the config file named in argv[1] and prints
    its ports as one JSON line) as the fleet's owner, a process a test can kill -9; the
    answer adds the servers' `pids`, found while the owner lives."""
    path = tmp_path / "owner.py"
    path.write_text(textwrap.dedent(script))
    (tmp_path / "config.json").write_text(config.model_dump_json())
    owner = subprocess.Popen(
        [sys.executable, str(path), str(tmp_path / "config.json")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, f"owner exited with {owner.wait()}"
    fleet: dict[str, Any] = json.loads(line)
    fleet["pids"] = server_pids(fleet["ports"], parent=owner.pid)
    return owner, fleet


def server_pids(ports: Sequence[int | None], parent: int | None = None) -> list[int]:
    """The PIDs of the servers `parent` (default this process) launched, in `ports` order, as
    an onlooker finds them (its running children that carry a fleet id, by their `--port`),
    not as the fleet says: a port no server listens for is left out."""
    by_port: dict[int, int] = {}
    for child in psutil.Process(parent).children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE or FLEET_ID_ENV not in child.environ():
                continue
            argv = child.cmdline()
        except psutil.Error:  # gone meanwhile
            continue
        if "--port" in argv:
            by_port[int(argv[argv.index("--port") + 1])] = child.pid
    return [by_port[port] for port in ports if port in by_port]
