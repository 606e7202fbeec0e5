"""Provisioning checks: everything that can be known before a GPU is rented or a server starts.

Every check runs even when another fails, so one rehearsal shows every problem at once;
any failed row stops the run before staging or launch. The checks are grouped by what they
look at: the engine (engine.py), the node (machine.py), the model (model.py), the data
(data.py) and the code (codecheck.py); report.py holds the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from regen.config import RegenConfig
from regen.machine.gpus import GpuProbe, NvmlProbe
from regen.preflight.codecheck import check_code
from regen.preflight.data import check_prompt_source, check_prompts, check_storage
from regen.preflight.engine import SglangProbe, check_config, check_engine, check_flags
from regen.preflight.machine import check_gpus, check_memory, check_ports
from regen.preflight.model import check_model, check_stage_space, model_bytes
from regen.preflight.report import CheckRow, PreflightReport, print_report

if TYPE_CHECKING:
    from regen.storage import Storage

__all__ = [
    "CheckRow",
    "PreflightReport",
    "check_code",
    "check_config",
    "check_engine",
    "check_flags",
    "check_gpus",
    "check_memory",
    "check_model",
    "check_ports",
    "check_prompt_source",
    "check_prompts",
    "check_stage_space",
    "check_storage",
    "print_report",
    "rehearsal_checks",
    "run_checks",
]


def run_checks(
    config: RegenConfig,
    gpu_probe: GpuProbe | None = None,
    *,
    packages: Sequence[str],
    open_output: Callable[[], Storage] | None = None,
    hf_token: str | None = None,
    lease_run: str | None = None,
) -> PreflightReport:
    """All checks, each isolated: one that raises becomes a failed row, the others still run.

    `packages` are the ones the code check compiles and imports: the caller's, since the
    layers that import this library (and that a run runs too) are theirs to name.
    `open_output` opens the output the run will keep using, so it is opened once.
    `hf_token` reads a Hub prompt set (None: huggingface_hub's own, HF_TOKEN).
    `lease_run`: a node of a multi-node run names its parent, whose lease it shares.
    """
    size = model_bytes(config)
    probe = SglangProbe(config)  # one import of sglang for the flags and engine rows
    checks: list[tuple[str, Callable[[], CheckRow]]] = [
        ("config", lambda: check_config(config)),
        ("flags", lambda: check_flags(config, probe)),
        ("code", lambda: check_code(packages)),
        ("model", lambda: check_model(config)),
        *(
            [("prompt source", lambda: check_prompt_source(config, hf_token))]
            if config.prompts.startswith("hf://")
            else []
        ),
        ("prompts", lambda: check_prompts(config, hf_token=hf_token)),
        ("storage", lambda: check_storage(config, open_output, lease_run)),
        ("engine", lambda: check_engine(config, probe=probe)),
        ("gpus", lambda: check_gpus(config, gpu_probe or NvmlProbe(), size)),
        ("ports", lambda: check_ports(config)),
        ("stage dir", lambda: check_stage_space(config, size)),
        ("ram", lambda: check_memory(config)),
    ]
    return PreflightReport(rows=_isolated(checks))


# Checks that mostly wait on a subprocess (the engine's interpreter importing sglang or the
# emulator; sglang's own parser of the launch flags): started first, in threads, so their
# seconds of imports overlap the others' work instead of adding to it.
_IN_BACKGROUND = frozenset({"engine", "flags"})


def _isolated(checks: list[tuple[str, Callable[[], CheckRow]]]) -> list[CheckRow]:
    with ThreadPoolExecutor(max_workers=len(_IN_BACKGROUND)) as pool:
        early = {
            name: pool.submit(_one, name, check) for name, check in checks if name in _IN_BACKGROUND
        }
        rows = [early[name] if name in early else _one(name, check) for name, check in checks]
        return [row if isinstance(row, CheckRow) else row.result() for row in rows]


def _one(name: str, check: Callable[[], CheckRow]) -> CheckRow:
    try:
        return check()
    except Exception as err:  # a check that cannot run is a failed check, not a crash
        first = (str(err).splitlines() or [type(err).__name__])[0]
        return CheckRow(name=name, status="fail", figure=first)


def rehearsal_checks(source: RegenConfig, rehearsal_output: str) -> PreflightReport:
    """What a rehearsal can judge of the GPU run's own config, before it swaps in emulators.

    The config, the servers' launch flags and the prompts (which the rehearsal reads too: rows
    with tools need a tool-call parser) are checked here as `regen check` checks them (same
    rows, same words). The node's facts (the model, the sglang venv, the GPUs, the ports, the
    stage dir, the output) cannot be seen from this machine: each is a `skipped` row saying
    `not checked here`, never dropped and never a failure.
    """
    engine = source.engine
    if engine.kind == "external":
        servers = f"engine.urls {', '.join(engine.urls)}"
    else:
        servers = f"engine.python {engine.python} ({engine.kind}, {engine.launcher})"
    stage = (
        f"model.stage_dir {source.model.staged_path()}"
        if source.model.stage
        else "model.stage false: the servers load model.source"
    )
    ports = f"{engine.base_port}-{engine.base_port + engine.num_servers - 1}"
    facts = {
        "model": f"model.source {source.model.source}",
        "engine": servers,
        "gpus": f"engine.gpus {engine.gpus}"
        if engine.device == "cuda"
        else f"engine.device cpu, {engine.servers} servers",
        "ports": f"{engine.host}:{ports}",
        "stage dir": stage,
        "storage": f"output {source.output}: the rehearsal writes {rehearsal_output}",
    }
    rows = _isolated(
        [
            ("config", lambda: check_config(source)),
            ("flags", lambda: check_flags(source)),
            ("prompts", lambda: check_prompts(source)),
        ]
    )
    rows += [
        CheckRow(
            name=name,
            status="skipped",
            figure=f"not checked here: {what}",
            hint="regen check on the GPU node",
        )
        for name, what in facts.items()
    ]
    return PreflightReport(rows=rows)
