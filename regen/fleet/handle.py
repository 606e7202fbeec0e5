"""`Fleet`: the servers of one run, their report, and the one way to stop them.

A server is started again (`restart`, the supervisor's relaunch) under the same lock as the
teardown, so a relaunch racing a teardown either is stopped by it or never starts.
Teardown is idempotent, takes a re-entrant lock (so a signal handler that interrupts a
teardown on the same thread finishes it instead of deadlocking) and never blocks without a
timeout, so it is safe from a `finally`, a Prefect hook on another thread, atexit, or a
signal handler.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from dataclasses import dataclass
from types import TracebackType

from pydantic import SecretStr

from regen.errors import FleetUnauthorized
from regen.fleet.process import ServerProcess, stop_processes
from regen.fleet.report import FleetRow
from regen.machine.ports import port_is_free
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeSettings, ProbeTarget, reprobe

log = logging.getLogger(__name__)


@dataclass
class Member:
    """One server of the fleet: where it answers, its process if regen started it, its row."""

    endpoint: Endpoint
    row: FleetRow
    process: ServerProcess | None = None


class Fleet:
    """Healthy servers to send work to; a context manager that tears the fleet down on exit."""

    def __init__(
        self,
        members: list[Member],
        target: ProbeTarget,
        settings: ProbeSettings,
        fleet_id: str = "",
    ) -> None:
        self._members = members
        self._target = target
        self._settings = settings
        self._fleet_id = fleet_id
        self._lock = threading.RLock()
        self._probes: dict[int, asyncio.Task[bool]] = {}
        self._closing = False
        self._torn_down = False
        if self._processes():
            atexit.register(self.teardown)

    def _processes(self) -> list[ServerProcess]:
        return [m.process for m in self._members if m.process is not None]

    @property
    def endpoints(self) -> list[Endpoint]:
        """The servers that passed their probes (the dispatcher's starting set)."""
        return [m.endpoint for m in self._members if m.row.status == "healthy"]

    @property
    def report(self) -> list[FleetRow]:
        """One row per configured server, healthy or not, in index order."""
        return [m.row for m in self._members]

    @property
    def launched(self) -> list[Member]:
        """The servers regen started (none on an external fleet): the supervisor's charge."""
        return [m for m in self._members if m.process is not None]

    @property
    def closing(self) -> bool:
        """Teardown has begun: a server that exits now was stopped, not crashed."""
        return self._closing

    @property
    def settings(self) -> ProbeSettings:
        return self._settings

    def restart(self, member: Member) -> ServerProcess | None:
        """Start `member`'s server again from its recorded command (same port, GPU and
        environment; its key file rewritten, its log appended); None once the fleet is torn
        down. The caller has stopped the old process."""
        with self._lock:
            if self._closing or member.process is None:
                return None
            return ServerProcess.start(
                member.process.command,
                self._fleet_id,
                on_started=lambda process: setattr(member, "process", process),
            )

    @property
    def api_key(self) -> SecretStr:
        return self._target.api_key

    @property
    def target(self) -> ProbeTarget:
        return self._target

    def update_report(self, rows: list[FleetRow]) -> None:
        """Replace rows by server name (the micro-benchmark fills in speeds)."""
        by_name = {r.server: r for r in rows}
        for member in self._members:
            member.row = by_name.get(member.row.server, member.row)

    async def reprobe(self, endpoint: Endpoint) -> bool:
        """Health + generation probe of a quarantined server; concurrent calls share one probe."""
        loop = asyncio.get_running_loop()
        running = self._probes.get(endpoint.index)
        if running is None or running.done() or running.get_loop() is not loop:
            running = loop.create_task(self._probe(endpoint))
            self._probes[endpoint.index] = running
        return await asyncio.shield(running)

    async def _probe(self, endpoint: Endpoint) -> bool:
        try:
            result = await reprobe(endpoint, self._target, self._settings)
        except FleetUnauthorized:
            raise  # the key changed under the server: the dispatcher stops the run on it
        except Exception as err:
            log.error("%s reprobe failed: %s", endpoint.name, err)
            return False
        if not result.ok:
            log.info("%s reprobe: %s", endpoint.name, result.reason)
        return result.ok

    def teardown(self, grace_s: float = 10.0) -> None:
        """SIGTERM each server's process group, SIGKILL after `grace_s`, wait for the ports."""
        with self._lock:
            if self._torn_down:
                return
            self._closing = True
            processes = self._processes()
            survivors = stop_processes(processes, grace_s)
            for proc in survivors:
                log.error("%s (pid %d) survived SIGKILL", proc.command.name, proc.pid)
            deadline = time.monotonic() + 2.0
            for proc in processes:
                cmd = proc.command
                while not port_is_free(cmd.host, cmd.port) and time.monotonic() < deadline:
                    time.sleep(0.02)
            self._torn_down = True
            atexit.unregister(self.teardown)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.teardown()
