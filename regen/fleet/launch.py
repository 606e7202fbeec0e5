"""Bring the fleet up: ports checked first, all servers started at once, each probed until ready.

Each server has its own deadline and its process is polled on every try, so a server that
dies while loading fails at once with its exit code and log tail instead of after the
startup timeout. `engine.min_servers` decides whether a partial fleet is good enough.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from functools import partial
from urllib.parse import urlsplit

import aiohttp
from pydantic import SecretStr

from regen.config import RegenConfig
from regen.errors import ConfigError, FleetError, UserError
from regen.fleet.aio import run_coroutine
from regen.fleet.commands import ServerCommand
from regen.fleet.handle import Fleet, Member
from regen.fleet.process import ServerProcess, stop_processes
from regen.fleet.report import FleetRow
from regen.machine.ports import taken_ports
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeResult, ProbeSettings, ProbeTarget, probe_server

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
_EXIT_POLL_S = 0.2  # how often a probe that waits checks that its server still runs


class FleetPortInUse(FleetError, UserError):
    """A server's port is taken before launch: another server or an earlier run holds it."""


def _row(endpoint: Endpoint, **fields: object) -> FleetRow:
    return FleetRow(
        server=endpoint.name,
        gpu=endpoint.gpu,
        port=urlsplit(endpoint.url).port,
        url=endpoint.url,
        **fields,
    )


async def await_ready(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    target: ProbeTarget,
    settings: ProbeSettings,
    timeout_s: float,
    process: ServerProcess | None,
) -> FleetRow:
    """Probe one server until it passes, fails for good, exits, or its deadline passes.

    Its process is watched while a probe waits too: a relaunched server that lost its port
    exits while a probe hangs on whatever holds the port."""
    start = process.started_mono if process is not None else time.monotonic()
    deadline = start + timeout_s
    last = "no answer yet"
    while True:
        code = process.exit_code() if process is not None else None
        if code is not None:
            assert process is not None
            return _row(
                endpoint,
                status="exited",
                reason=f"exited with code {code} after {time.monotonic() - start:.1f} s; "
                f"last lines of {process.command.log_path}:\n{process.log_tail(LOG_TAIL_LINES)}",
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return _row(
                endpoint,
                status="timed_out",
                reason=f"not ready within {timeout_s:g} s (last probe: {last})",
            )
        try:
            async with asyncio.timeout(remaining):
                result = await _probe_while_alive(session, endpoint, target, settings, process)
        except TimeoutError:
            continue
        if result is None:
            continue  # it exited: said at the top of the loop
        if result.ok:
            return _row(
                endpoint,
                status="healthy",
                startup_s=round(time.monotonic() - start, 3),
                probe_latency_s=result.latency_s,
            )
        if not result.retryable:
            return _row(endpoint, status="unhealthy", reason=result.reason)
        last = result.reason
        await asyncio.sleep(min(settings.interval_s, max(0.0, deadline - time.monotonic())))


async def _probe_while_alive(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    target: ProbeTarget,
    settings: ProbeSettings,
    process: ServerProcess | None,
) -> ProbeResult | None:
    """One probe, or None as soon as `process` has exited."""
    probe = asyncio.ensure_future(probe_server(session, endpoint, target, settings))
    try:
        while not probe.done():
            await asyncio.wait({probe}, timeout=_EXIT_POLL_S)
            if not probe.done() and process is not None and process.exit_code() is not None:
                return None
        return probe.result()
    finally:
        if not probe.done():
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)


async def _await_all(
    members: list[Member],
    target: ProbeTarget,
    settings: ProbeSettings,
    timeout_s: float,
    needed: int,
) -> None:
    """Wait for every server, but stop waiting once `needed` healthy ones are out of reach."""
    async with aiohttp.ClientSession() as session:
        tasks = {
            asyncio.create_task(
                await_ready(session, m.endpoint, target, settings, timeout_s, m.process)
            ): m
            for m in members
        }
        pending = set(tasks)
        failed = 0
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    tasks[task].row = task.result()  # FleetUnauthorized propagates from here
                    failed += tasks[task].row.status != "healthy"
                if len(members) - failed < needed:
                    break
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    for task in pending:
        member = tasks[task]
        member.row = member.row.model_copy(
            update={"reason": "not waited for: too many other servers had failed"}
        )


def _describe_failures(rows: list[FleetRow]) -> str:
    lines = []
    for row in rows:
        head, _, tail = row.reason.partition("\n")
        lines.append(f"  {row.server} (gpu {row.gpu}, {row.url}): {row.status}: {head}")
        lines.extend(f"    | {line}" for line in tail.splitlines())
    return "\n".join(lines)


def _apply_policy(members: list[Member], min_servers: int, grace_s: float, what: str) -> None:
    """Stop the servers that failed; raise unless at least `min_servers` are healthy."""
    failed = [m for m in members if m.row.status != "healthy"]
    healthy = len(members) - len(failed)
    stop_processes([m.process for m in failed if m.process is not None], grace_s)
    if healthy < min_servers:
        raise FleetError(
            f"fleet: {healthy} of {len(members)} servers {what}, "
            f"engine.min_servers needs {min_servers}:\n"
            + _describe_failures([m.row for m in failed])
        )
    if failed:
        log.warning(
            "fleet: going on with %d of %d servers (engine.min_servers %d); stopped:\n%s",
            healthy,
            len(members),
            min_servers,
            _describe_failures([m.row for m in failed]),
        )


def _refuse_taken_ports(commands: list[ServerCommand]) -> None:
    """Fail before anything starts when a port is taken, naming the port and the server."""
    held = set(taken_ports((c.host, c.port) for c in commands))
    taken = [c for c in commands if (c.host, c.port) in held]
    if taken:
        names = ", ".join(f"port {c.port} ({c.name}) on {c.host}" for c in taken)
        raise FleetPortInUse(
            f"fleet: {names} already in use; stop what holds it or change engine.base_port"
        )


def launch_fleet(
    config: RegenConfig,
    commands: list[ServerCommand],
    api_key: SecretStr,
    *,
    startup_timeout_s: float | None = None,
    min_servers: int | None = None,
    probe_settings: ProbeSettings | None = None,
    grace_s: float = 10.0,
) -> Fleet:
    """Start every command in parallel and return once enough servers passed a real generation.

    Defaults come from `config.engine` (startup_timeout_s, min_servers: all). On any failure
    or interruption every started process group is stopped before the error propagates.
    """
    if not commands:
        raise FleetError("fleet: no server commands to launch (no GPU in engine.gpus)")
    _refuse_taken_ports(commands)
    target = ProbeTarget(config.model.served_name, api_key, config.sampling)
    settings = probe_settings or ProbeSettings()
    timeout_s = startup_timeout_s or config.engine.startup_timeout_s
    needed = min_servers or config.engine.min_servers or len(commands)
    fleet_id = uuid.uuid4().hex
    members: list[Member] = []
    try:
        for command in commands:
            endpoint = Endpoint(command.index, command.url, command.gpu)
            try:
                process = ServerProcess.start(
                    command, fleet_id, on_started=partial(_enlist, members, endpoint)
                )
            except OSError as err:  # the interpreter or `sglang` script is not there
                raise ConfigError(
                    f"engine.python: cannot start {command.argv[0]}: {err.strerror}"
                ) from None
            log.info("%s started: pid %d, log %s", command.name, process.pid, command.log_path)
        run_coroutine(_await_all(members, target, settings, timeout_s, needed))
        _apply_policy(members, needed, grace_s, "became ready")
    except BaseException:
        stop_processes([m.process for m in members if m.process is not None], grace_s)
        raise
    for member in members:
        if member.process is not None:
            # Read at argument parsing: a ready server no longer needs its key on disk.
            member.process.command.key_file.unlink(missing_ok=True)
            member.process.record_cmdline()
    return Fleet(members, target, settings, fleet_id)


def _enlist(members: list[Member], endpoint: Endpoint, process: ServerProcess) -> None:
    """A started server joins the fleet's members, the list that teardown stops."""
    members.append(Member(endpoint, _row(endpoint, status="unhealthy"), process))


def attach_fleet(
    config: RegenConfig,
    api_key: SecretStr,
    *,
    timeout_s: float = 60.0,
    min_servers: int | None = None,
    probe_settings: ProbeSettings | None = None,
) -> Fleet:
    """`engine.kind: external`: probe the given URLs; regen never starts or stops them."""
    urls = config.engine.urls
    if not urls:
        raise FleetError("fleet: engine.urls is empty; nothing to attach to")
    target = ProbeTarget(config.model.served_name, api_key, config.sampling)
    settings = probe_settings or ProbeSettings()
    members = []
    for index, url in enumerate(urls):
        endpoint = Endpoint(index, url.rstrip("/"))
        members.append(Member(endpoint, _row(endpoint, status="unhealthy")))
    needed = min_servers or config.engine.min_servers or len(members)
    run_coroutine(_await_all(members, target, settings, timeout_s, needed))
    _apply_policy(members, needed, 0.0, "answered")
    return Fleet(members, target, settings)
