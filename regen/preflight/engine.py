"""The serving engine's checks: the config's limits against the engine's, the exact launch
commands through sglang's own parser, and the engine importable where it will run."""

from __future__ import annotations

import functools
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from regen.config import RegenConfig
from regen.errors import ConfigError
from regen.preflight.report import CheckRow
from regen.storage.filesystems import fs_type

if TYPE_CHECKING:
    from regen.fleet.commands import ServerCommand
    from regen.fleet.flagcheck import SglangAnswer

# An import of the engine slower than this is a warning (24.5 s on a loaded 2-core CPU).
SLOW_IMPORT_S = 60.0
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


class SglangProbe:
    """`engine.python` asked once for the two rows that need sglang: the flags row (each launch
    argv through its parser) and the engine row (its version, how long its import took).
    Each start imports sglang, 10-25 s on a small CPU: a preflight started it twice."""

    def __init__(self, config: RegenConfig, timeout_s: float = 300.0) -> None:
        self.config = config
        self.timeout_s = timeout_s

    @functools.cached_property
    def commands(self) -> list[ServerCommand]:
        """The launch commands as the fleet will build them; ConfigError if it refuses."""
        from regen.fleet.commands import build_server_commands

        config = self.config
        key = config.engine.api_key or SecretStr("preflight-placeholder-key")
        return build_server_commands(config, config.model.staged_path(), key, config.work_dir)

    @functools.cached_property
    def answer(self) -> SglangAnswer:
        from regen.fleet.flagcheck import ask_sglang

        engine = self.config.engine
        try:
            commands = self.commands
        except ConfigError:  # the flags row says why; the engine row still asks for sglang
            commands = []
        python = shutil.which(engine.python) or engine.python
        return ask_sglang(python, commands, engine, self.timeout_s)


def check_flags(config: RegenConfig, probe: SglangProbe | None = None) -> CheckRow:
    """The launch commands, built now: a removed flag in engine.extra_args (argparse kills every
    server at start-up), or one regen sets itself (`--api-key` would land in `ps`), fails here;
    then each exact argv goes through sglang's own parser (or 0.5.23's vendored flag set)."""
    from regen.fleet.commands import DEPRECATED_FLAGS
    from regen.fleet.flagcheck import check_argvs

    if config.engine.kind == "external":
        return CheckRow(name="flags", status="skipped", figure="external servers")
    probe = probe or SglangProbe(config)
    try:
        commands = probe.commands
    except ConfigError as err:
        return CheckRow(name="flags", status="fail", figure=str(err), hint="edit the config")
    answer = probe.answer if config.engine.kind == "sglang" else None
    verdict = check_argvs(commands, config.engine, answer=answer)
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


def check_engine(
    config: RegenConfig, import_timeout_s: float = 300.0, probe: SglangProbe | None = None
) -> CheckRow:
    """The engine importable where it will run and its version known to the command builder.
    sglang's answer is `probe`'s, shared with the flags row. An import slower than
    SLOW_IMPORT_S (a venv on a network file system) is a warning: it costs seconds, and a
    slow CPU is no reason to refuse a run; no answer in `import_timeout_s` is a failure."""
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
    if engine.kind == "sglang":
        probe = probe or SglangProbe(config, timeout_s=import_timeout_s)
        answer = probe.answer
        if answer.timed_out:
            return _no_answer("sglang", probe.timeout_s)
        return _engine_row("sglang", answer.version, answer.import_s, python, answer.failure)
    code = "import regen.emulator as m; print(getattr(m, '__version__', 'ok'))"
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
        return _no_answer("regen.emulator", import_timeout_s)
    took = time.monotonic() - start
    failure = None
    if proc.returncode != 0:
        failure = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return _engine_row("regen.emulator", proc.stdout.strip(), took, python, failure)


_NETWORK_FS_HINT = "put the venv on a local disk, not a network file system"


def _no_answer(module: str, timeout_s: float) -> CheckRow:
    return CheckRow(
        name="engine",
        status="fail",
        figure=f"import {module} took over {timeout_s:.0f} s",
        hint=_NETWORK_FS_HINT,
    )


def _engine_row(
    module: str, version: str | None, took: float, python: str, failure: str | None
) -> CheckRow:
    if failure is not None or version is None:
        return CheckRow(
            name="engine",
            status="fail",
            figure=f"import {module} failed: {failure}",
            hint=f"{python} -m pip install sglang=={KNOWN_SGLANG[-1]}"
            if module == "sglang"
            else f"install regen into {python}",
        )
    fs = fs_type(Path(python))
    figure = f"{module} {version} in {took:.1f} s ({python}, {fs})"
    if module == "sglang" and version not in KNOWN_SGLANG:
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
    if took > SLOW_IMPORT_S:
        return CheckRow(
            name="engine", status="warn", figure=f"{figure}: slow", hint=_NETWORK_FS_HINT
        )
    return CheckRow(name="engine", status="pass", figure=figure)
