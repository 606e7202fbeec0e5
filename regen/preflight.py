"""Provisioning checks: everything that can be known before a GPU is rented or a server starts.

Every check runs even when another fails, so one rehearsal shows every problem at once;
any failed row stops the run before staging or launch.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import psutil
from pydantic import BaseModel, SecretStr

from regen.config import RegenConfig
from regen.errors import ConfigError, UserError
from regen.filesystems import existing_parent, fs_type
from regen.gpus import GpuProbe, NvmlProbe
from regen.ports import port_is_free

if TYPE_CHECKING:
    from regen.storage import Storage

Status = Literal["ok", "warn", "fail", "skip"]

# The sglang releases whose launch flags the command builder was written against.
KNOWN_SGLANG = ("0.5.23",)
# Everything a run imports: the library and the Prefect layer over it.
CODE_PACKAGES = ("regen", "tasks", "flows", "blocks")
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


class CheckRow(BaseModel):
    """One line of the provisioning table: what was checked, what was found, how to fix it."""

    name: str
    status: Status
    figure: str = ""
    hint: str = ""


class PreflightReport(BaseModel):
    rows: list[CheckRow]

    @property
    def ok(self) -> bool:
        return all(r.status != "fail" for r in self.rows)

    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status == "fail"]

    def summary(self) -> str:
        """One line per failed check, for the error that fails the stage."""
        return "; ".join(
            f"{r.name}: {r.figure} ({r.hint})" if r.hint else f"{r.name}: {r.figure}"
            for r in self.failures()
        )


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_config(config: RegenConfig) -> CheckRow:
    problems = []
    if config.concurrency > config.engine.max_running_requests:
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
        status="ok",
        figure=f"shard_size {config.shard_size}, concurrency {config.concurrency}",
    )


def _module_name(package: str, location: Path, path: Path) -> str:
    parts = list(path.relative_to(location).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _syntax_errors(package: str, location: Path) -> dict[str, str]:
    """Module name -> message for every source file under `location` that does not compile.

    Compiled in memory, not with compileall: an installed tree may be read-only, and
    compileall reports only that *something* under a directory failed, not what.
    """
    bad = {}
    for path in sorted(location.rglob("*.py")):
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as err:
            name = _module_name(package, location, path)
            line = getattr(err, "lineno", None)
            where = f"{path.name} line {line}" if line else path.name
            msg = getattr(err, "msg", None) or str(err)
            bad[name] = f"{name} ({where}): {type(err).__name__}: {msg}"
    return bad


def check_code(packages: Sequence[str] = CODE_PACKAGES) -> CheckRow:
    """Compile and import every module that will run: the incident's SyntaxError, caught here."""
    bad: list[str] = []
    count = 0
    for package in packages:
        try:
            mod = importlib.import_module(package)
        except Exception as err:  # the package's own __init__ is code that will run too
            bad.append(f"{package}: {type(err).__name__}: {str(err).splitlines()[0]}")
            continue
        broken: dict[str, str] = {}
        for location in getattr(mod, "__path__", []):
            broken.update(_syntax_errors(package, Path(location)))
        bad.extend(broken.values())
        # onerror: a broken subpackage is reported by the import below, not raised mid-walk.
        for info in pkgutil.walk_packages(mod.__path__, f"{package}.", onerror=lambda _: None):
            if info.name.endswith("__main__") or info.name in broken:
                continue
            count += 1
            try:
                importlib.import_module(info.name)
            except Exception as err:  # any import failure is exactly what this check is for
                bad.append(f"{info.name}: {type(err).__name__}: {str(err).splitlines()[0]}")
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        return CheckRow(
            name="code",
            status="fail",
            figure="; ".join(bad[:3]) + more,
            hint="fix the module before renting GPUs",
        )
    return CheckRow(name="code", status="ok", figure=f"{count} modules compile and import")


def check_model(config: RegenConfig) -> CheckRow:
    """A local model directory SGLang cannot load fails here, not when seven servers start."""
    from regen.staging import missing_model_files

    source = config.model.source
    if config.engine.kind == "external":
        return CheckRow(name="model", status="skip", figure="external servers load their own")
    if "://" in source:
        return CheckRow(name="model", status="skip", figure=f"{source}: checked when staging")
    root = Path(source).expanduser()
    if not root.is_dir():
        return CheckRow(
            name="model",
            status="fail",
            figure=f"{source}: model directory does not exist",
            hint="fix model.source",
        )
    missing = missing_model_files(p.name for p in root.iterdir())
    if missing:
        return CheckRow(
            name="model",
            status="fail",
            figure=f"{source}: missing {', '.join(missing)}",
            hint="model.source must be a Hugging Face model directory",
        )
    return CheckRow(name="model", status="ok", figure=f"{source}: config, weights, tokenizer")


def check_flags(config: RegenConfig) -> CheckRow:
    """The launch commands, built now: a removed flag in engine.extra_args (argparse kills every
    server at start-up), or one regen sets itself (`--api-key` would land in `ps`), fails here;
    then each exact argv goes through sglang's own parser (or 0.5.23's vendored flag set)."""
    from regen.fleet.commands import DEPRECATED_FLAGS, build_server_commands
    from regen.fleet.flagcheck import check_argvs

    if config.engine.kind == "external":
        return CheckRow(name="flags", status="skip", figure="external servers")
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
    return CheckRow(name="flags", status="ok", figure=figure)


def check_engine(config: RegenConfig, import_timeout_s: float = 60.0) -> CheckRow:
    engine = config.engine
    if engine.kind == "external":
        return CheckRow(name="engine", status="skip", figure="external servers, nothing to launch")
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
            hint=f"install it into {python}",
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
    return CheckRow(name="engine", status="ok", figure=figure)


def check_gpus(config: RegenConfig, probe: GpuProbe, model_bytes: int | None) -> CheckRow:
    if config.engine.kind != "sglang":
        return CheckRow(name="gpus", status="skip", figure=f"not needed ({config.engine.kind})")
    try:
        gpus = probe.gpus()
    except RuntimeError as err:
        return CheckRow(
            name="gpus",
            status="fail",
            figure=str(err),
            hint="check the driver (nvidia-smi) and nvidia-ml-py",
        )
    by_index = {g.index: g for g in gpus}
    missing = [i for i in config.engine.gpus if i not in by_index]
    if missing:
        return CheckRow(
            name="gpus",
            status="fail",
            figure=f"GPU {missing} not present ({len(gpus)} found)",
            hint="fix engine.gpus",
        )
    short = []
    for i in config.engine.gpus:
        g = by_index[i]
        # One server per GPU holds the whole model inside its static pool, next to the KV cache.
        pool = config.engine.mem_fraction_static * g.total_bytes
        if g.free_bytes < pool:
            short.append(f"GPU {i}: {_gb(g.free_bytes)} free < {_gb(pool)} needed")
        elif model_bytes is not None and model_bytes >= pool:
            short.append(f"GPU {i}: model {_gb(model_bytes)} >= static pool {_gb(pool)}")
    driver = gpus[0].driver if gpus else "?"
    figure = f"{len(config.engine.gpus)} of {len(gpus)} GPUs, driver {driver}"
    if short:
        return CheckRow(
            name="gpus",
            status="fail",
            figure=f"{figure}; " + "; ".join(short),
            hint="another process holds GPU memory (nvidia-smi)",
        )
    return CheckRow(name="gpus", status="ok", figure=figure)


def check_ports(config: RegenConfig) -> CheckRow:
    if config.engine.kind == "external":
        return CheckRow(name="ports", status="skip", figure="external servers")
    ports = [config.engine.base_port + i for i in range(config.engine.num_servers)]
    taken = [p for p in ports if not port_is_free(config.engine.host, p)]
    if taken:
        return CheckRow(
            name="ports",
            status="fail",
            figure=f"in use: {taken}",
            hint="stop what listens there or change engine.base_port",
        )
    return CheckRow(name="ports", status="ok", figure=f"{ports[0]}-{ports[-1]} free")


def check_stage_space(config: RegenConfig, model_bytes: int | None) -> CheckRow:
    if not config.model.stage:
        return CheckRow(name="stage dir", status="skip", figure="model.stage is false")
    target = config.model.staged_path()
    if model_bytes is None:
        return CheckRow(
            name="stage dir", status="skip", figure="model size known only after listing the source"
        )
    from regen.staging import check_space

    already = _dir_size(target) if target.is_dir() else 0
    free = shutil.disk_usage(existing_parent(target)).free
    figure = f"{_gb(model_bytes)} model, {_gb(free)} free at {target}"
    try:
        # The same rule staging applies, so a check that passes never fails at the copy.
        check_space(target, model_bytes - already, margin_bytes=0)
    except UserError as err:
        return CheckRow(
            name="stage dir",
            status="fail",
            figure=str(err),
            hint="free space on the RAM disk or set model.stage_dir",
        )
    return CheckRow(name="stage dir", status="ok", figure=figure)


def check_storage(
    config: RegenConfig, open_output: Callable[[], Storage] | None = None
) -> CheckRow:
    from regen.storage import open_storage, probe

    storage = open_output() if open_output else open_storage(config.output)
    probe(storage)
    return CheckRow(name="storage", status="ok", figure=f"{storage.uri} writable and readable")


def check_prompts(config: RegenConfig, sample_rows: int = 1000) -> CheckRow:
    """The first rows' figure, with the valid rows per format: rows describe themselves, so a
    file may mix formats, and the count says whether that was meant."""
    from regen.prompts import format_counts, preview

    try:
        found = preview(config.prompts, sample_rows)
    except UserError as err:
        return CheckRow(name="prompts", status="fail", figure=str(err), hint="fix the prompts file")
    counts = format_counts(found.formats)
    figure = f"{found.valid} of first {found.rows_checked} rows valid ({counts})"
    if found.valid == 0:
        reason = f"{config.prompts}: {found.first_reason}"
        return CheckRow(name="prompts", status="fail", figure=reason, hint="fix the prompts file")
    if found.rejected:
        figure = f"{figure}; first: {found.first_reason}"
        return CheckRow(
            name="prompts", status="warn", figure=figure, hint="rejected rows go to rejects/"
        )
    return CheckRow(name="prompts", status="ok", figure=figure)


def _model_bytes(config: RegenConfig) -> int | None:
    source = Path(config.model.source)
    return _dir_size(source) if "://" not in config.model.source and source.is_dir() else None


def check_memory(config: RegenConfig) -> CheckRow:
    mem = psutil.virtual_memory()
    return CheckRow(
        name="ram",
        status="ok" if mem.available > 2e9 else "warn",
        figure=f"{_gb(mem.available)} available of {_gb(mem.total)}",
    )


def run_checks(
    config: RegenConfig,
    gpu_probe: GpuProbe | None = None,
    *,
    packages: Sequence[str] = CODE_PACKAGES,
    open_output: Callable[[], Storage] | None = None,
) -> PreflightReport:
    """All checks, each isolated: one that raises becomes a failed row, the others still run.

    `packages` are the ones the code check compiles and imports; `open_output` opens the
    output the run will keep using, so it is opened once.
    """
    model_bytes = _model_bytes(config)
    checks: list[tuple[str, Callable[[], CheckRow]]] = [
        ("config", lambda: check_config(config)),
        ("flags", lambda: check_flags(config)),
        ("code", lambda: check_code(packages)),
        ("model", lambda: check_model(config)),
        ("prompts", lambda: check_prompts(config)),
        ("storage", lambda: check_storage(config, open_output)),
        ("engine", lambda: check_engine(config)),
        ("gpus", lambda: check_gpus(config, gpu_probe or NvmlProbe(), model_bytes)),
        ("ports", lambda: check_ports(config)),
        ("stage dir", lambda: check_stage_space(config, model_bytes)),
        ("ram", lambda: check_memory(config)),
    ]
    rows = []
    for name, check in checks:
        try:
            rows.append(check())
        except Exception as err:  # a check that cannot run is a failed check, not a crash
            first = (str(err).splitlines() or [type(err).__name__])[0]
            rows.append(CheckRow(name=name, status="fail", figure=first))
    return PreflightReport(rows=rows)


def print_report(report: PreflightReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    styles = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
    table = Table(title="regen provisioning checks")
    for col in ("check", "status", "figure", "fix"):
        table.add_column(col)
    for r in report.rows:
        # Figures quote paths and pip extras ("regen[sglang]") that rich would read as markup.
        table.add_row(
            r.name, f"[{styles[r.status]}]{r.status}[/]", escape(r.figure), escape(r.hint)
        )
    Console(width=max(120, shutil.get_terminal_size().columns)).print(table)
    print("provisioning: " + ("ok" if report.ok else "FAILED"))
