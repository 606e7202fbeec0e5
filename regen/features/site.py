"""The capture fleet: the generation fleet's servers launched to capture, not to draft.

The servers get the convention's flags (regen.features.layers), no speculative decoding (the
flag that names the convention is SGLang's --speculative-algorithm, which then loads no
draft: srt/arg_groups/validation_hook.py:697-753), `--disable-radix-cache` (a cached prefix
is not computed again, so its tokens would have no states: every sample's prompt shares the
system prompt and a multi-turn row's turns share their history), and regen's capture module:
`sglang_site/` first on PYTHONPATH (its sitecustomize arms the module in every process of
the server, the spawned scheduler included, without installing anything into the server's
venv) and REGEN_CAPTURE_DIR, where each request's tensors go. That directory is under
/dev/shm when there is one: the files are read once, by regen on the same node, and deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import psutil
from pydantic import SecretStr

from regen.config import RegenConfig
from regen.errors import ConfigError
from regen.features.capture import CAPTURE_ENV
from regen.features.layers import CaptureLayers
from regen.features.pool import CaptureServer
from regen.fleet.commands import ServerCommand, build_server_commands
from regen.fleet.handle import Fleet
from regen.fleet.launch import launch_fleet
from regen.machine.owned import alive

SITE_DIR = Path(__file__).resolve().parent / "sglang_site"
SHM = Path("/dev/shm")
CAPTURE_FLAGS = ("--disable-radix-cache",)


def capture_config(config: RegenConfig, layers: CaptureLayers) -> RegenConfig:
    """The run's config with its servers launched to capture `layers`."""
    engine = config.engine
    extra = [*engine.extra_args, *layers.flags(), *CAPTURE_FLAGS]
    speculative = engine.speculative.model_copy(update={"enabled": False})
    engine = engine.model_copy(update={"extra_args": extra, "speculative": speculative})
    return config.model_copy(update={"engine": engine})


def capture_root(work_dir: Path, run_id: str) -> Path:
    """Where this run's servers write their capture files."""
    base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(work_dir)
    return base / "regen-capture" / run_id


def with_capture_module(commands: list[ServerCommand], root: Path) -> list[ServerCommand]:
    """Each command with the capture module on its PYTHONPATH and its own capture dir."""
    path = os.pathsep.join(filter(None, [str(SITE_DIR), os.environ.get("PYTHONPATH")]))
    return [
        replace(c, env={**c.env, "PYTHONPATH": path, CAPTURE_ENV: str(root / c.name)})
        for c in commands
    ]


@contextmanager
def capture_fleet(
    config: RegenConfig, model_path: Path, api_key: SecretStr, layers: CaptureLayers, run_id: str
) -> Iterator[tuple[Fleet, list[CaptureServer]]]:
    """The capture fleet, up (a real generation answered on every server), and where each
    server writes; torn down and its capture files removed on the way out."""
    if config.engine.kind == "external":
        raise ConfigError(
            "features: engine.kind external: regen launches the capture fleet itself (its "
            "servers load regen's capture module); use engine.kind sglang"
        )
    capture = capture_config(config, layers)
    root = capture_root(config.work_dir, run_id)
    reap_capture_dirs(root.parent)
    _claim(root, config.work_dir)
    commands = build_server_commands(capture, model_path, api_key, config.work_dir, run_id)
    fleet = launch_fleet(capture, with_capture_module(commands, root), api_key)
    try:
        with fleet:
            yield fleet, [CaptureServer(e, root / e.name) for e in fleet.endpoints]
    finally:
        shutil.rmtree(root, ignore_errors=True)


OWNER = "owner.json"


def _claim(root: Path, work_dir: Path) -> None:
    """Record this process (and its run's work dir) as the capture dir's owner."""
    root.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    owner = {"pid": me.pid, "started_at": me.create_time(), "work_dir": str(work_dir)}
    (root / OWNER).write_text(json.dumps(owner))


def reap_capture_dirs(parent: Path) -> list[Path]:
    """Remove the capture dirs of runs whose process is gone (a kill -9 leaves its servers'
    last files on the RAM disk); a dir without a readable owner is left alone."""
    removed = []
    for directory in sorted(parent.glob("*")) if parent.is_dir() else []:
        try:
            owner = json.loads((directory / OWNER).read_text())
            dead = not alive(int(owner["pid"]), float(owner["started_at"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if dead:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed
