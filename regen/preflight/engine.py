"""The serving engine's checks: the config's limits against the engine's, the exact launch
commands through sglang's own parser, and the engine importable where it will run."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from pydantic import SecretStr

from regen.config import RegenConfig
from regen.errors import ConfigError
from regen.preflight.report import CheckRow
from regen.storage.filesystems import fs_type

# The sglang releases whose launch flags the command builder was written against.
KNOWN_SGLANG = ("0.5.23",)
REMOTE_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smbfs",
    "fuse",
    "fuse.sshfs",
    "lustre",
    "gpfs",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "9p",
}


def check_config(config: RegenConfig) -> CheckRow:
    problems = []
    cap = config.engine.max_running_requests
    if cap is not None and config.concurrency > cap:
        problems.append(
            f"concurrency_per_server {config.concurrency} > engine.max_running_requests "
            f"{config.engine.max_running_requests} (requests would queue inside the server)"
        )
    if config.sampling.max_tokens >= config.engine.context_length:
        problems.append(
            f"sampling.max_tokens {config.sampling.max_tokens} leaves no room for a prompt in "
            f"engine.context_length {config.engine.context_length}"
        )
    if problems:
        return CheckRow(
            name="config", status="fail", figure="; ".join(problems), hint="fix the config"
        )
    return CheckRow(
        name="config",
        status="pass",
        figure=f"shard_size {config.shard_size}, concurrency {config.concurrency}",
    )


def check_flags(config: RegenConfig) -> CheckRow:
    """The launch commands, built now: a removed flag in engine.extra_args (argparse kills every
    server at start-up), or one regen sets itself (`--api-key` would land in `ps`), fails here;
    then each exact argv goes through sglang's own parser (or 0.5.23's vendored flag set)."""
    from regen.fleet.commands import DEPRECATED_FLAGS, build_server_commands
    from regen.fleet.flagcheck import check_argvs

    if config.engine.kind == "external":
        return CheckRow(name="flags", status="skipped", figure="external servers")
    key = config.engine.api_key or SecretStr("preflight-placeholder-key")
    try:
        commands = build_server_commands(config, config.model.staged_path(), key, config.work_dir)
    except ConfigError as err:
        return CheckRow(name="flags", status="fail", figure=str(err), hint="edit the config")
    verdict = check_argvs(commands, config.engine)
    if verdict.problem:
        return CheckRow(
            name="flags",
            status="fail",
            figure=verdict.problem,
            hint=f"refused by {verdict.judge}: every server would exit 2 at launch",
        )
    given = {a.split("=", 1)[0] for a in config.engine.extra_args if a.startswith("--")}
    figure = f"{len(commands)} server commands, {len(given)} extra flags, parsed by {verdict.judge}"
    deprecated = sorted(given & DEPRECATED_FLAGS)
    if deprecated:
        return CheckRow(
            name="flags",
            status="warn",
            figure=f"{figure}; deprecated in sglang {KNOWN_SGLANG[-1]}: {', '.join(deprecated)}",
            hint="edit engine.extra_args",
        )
    return CheckRow(name="flags", status="pass", figure=figure)


def check_engine(config: RegenConfig, import_timeout_s: float = 60.0) -> CheckRow:
    engine = config.engine
    if engine.kind == "external":
        return CheckRow(
            name="engine", status="skipped", figure="external servers, nothing to launch"
        )
    python = shutil.which(engine.python) or engine.python
    if not Path(python).exists():
        return CheckRow(
            name="engine",
            status="fail",
            figure=f"{engine.python} not found",
            hint="set engine.python to the venv interpreter that has sglang",
        )
    module = "sglang" if engine.kind == "sglang" else "regen.emulator"
    code = f"import {module} as m; print(getattr(m, '__version__', 'ok'))"
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=import_timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CheckRow(
            name="engine",
            status="fail",
            figure=f"import {module} took over {import_timeout_s:.0f} s",
            hint="put the venv on a local disk, not a network file system",
        )
    took = time.monotonic() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return CheckRow(
            name="engine",
            status="fail",
            figure=f"import {module} failed: {last}",
            hint=f"{python} -m pip install sglang=={KNOWN_SGLANG[-1]}"
            if engine.kind == "sglang"
            else f"install regen into {python}",
        )
    version = proc.stdout.strip()
    fs = fs_type(Path(python))
    figure = f"{module} {version} in {took:.1f} s ({python}, {fs})"
    if engine.kind == "sglang" and version not in KNOWN_SGLANG:
        return CheckRow(
            name="engine",
            status="fail",
            figure=figure,
            hint=f"the command builder knows sglang {', '.join(KNOWN_SGLANG)}",
        )
    if fs in REMOTE_FILESYSTEMS or fs.startswith("fuse"):
        return CheckRow(
            name="engine",
            status="warn",
            figure=figure,
            hint="the venv is on a network file system: imports will be slow",
        )
    return CheckRow(name="engine", status="pass", figure=figure)
