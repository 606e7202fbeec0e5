"""The node's checks: GPUs with room for the model, the server ports free, memory to spare."""

from __future__ import annotations

import psutil

from regen.config import RegenConfig
from regen.display.figures import byte_size
from regen.fleet.orphans import find_orphans
from regen.machine.gpus import GpuProbe
from regen.machine.ports import taken_ports
from regen.preflight.report import CheckRow


def check_gpus(config: RegenConfig, probe: GpuProbe, model_bytes: int | None) -> CheckRow:
    if config.engine.kind != "sglang":
        return CheckRow(name="gpus", status="skipped", figure=f"not needed ({config.engine.kind})")
    if config.engine.device == "cpu":
        return CheckRow(
            name="gpus", status="skipped", figure=f"cpu: {config.engine.servers} servers, no GPU"
        )
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
            short.append(f"GPU {i}: {byte_size(g.free_bytes)} free < {byte_size(pool)} needed")
        elif model_bytes is not None and model_bytes >= pool:
            model = byte_size(model_bytes)
            short.append(f"GPU {i}: model {model} >= static pool {byte_size(pool)}")
    driver = gpus[0].driver if gpus else "?"
    figure = f"{len(config.engine.gpus)} of {len(gpus)} GPUs, driver {driver}"
    if short:
        return CheckRow(
            name="gpus",
            status="fail",
            figure=f"{figure}; " + "; ".join(short),
            hint="another process holds GPU memory (nvidia-smi)",
        )
    return CheckRow(name="gpus", status="pass", figure=figure)


def check_ports(config: RegenConfig) -> CheckRow:
    engine = config.engine
    if engine.kind == "external":
        return CheckRow(name="ports", status="skipped", figure="external servers")
    ports = [engine.base_port + i for i in range(engine.num_servers)]
    taken = [port for _, port in taken_ports((engine.host, p) for p in ports)]
    orphans = [o for o in find_orphans(config.work_dir) if o.processes and o.port in taken]
    if taken and {o.port for o in orphans} == set(taken):
        # A killed run's servers: the run reaps them before its launch, so they cost nothing.
        return CheckRow(
            name="ports",
            status="warn",
            figure=f"in use: {taken} by an earlier run's servers, whose owner is gone: "
            + "; ".join(o.describe() for o in orphans),
            hint="regen run stops them (SIGTERM, then SIGKILL) before it launches",
        )
    if taken:
        held = "".join(f"; {o.describe()} is an earlier run's server" for o in orphans)
        return CheckRow(
            name="ports",
            status="fail",
            figure=f"in use: {taken}{held}",
            hint="stop what listens there or change engine.base_port",
        )
    return CheckRow(name="ports", status="pass", figure=f"{ports[0]}-{ports[-1]} free")


def check_memory(config: RegenConfig) -> CheckRow:
    mem = psutil.virtual_memory()
    return CheckRow(
        name="ram",
        status="pass" if mem.available > 2e9 else "warn",
        figure=f"{byte_size(mem.available)} available of {byte_size(mem.total)}",
    )
