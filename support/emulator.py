"""The emulator on loopback, two ways: `python -m regen.emulator` in its own session
(`emulators`), or its app served by this process (`in_process`) where no process is needed.

Its own session so that one killpg stops it with anything it started, and a test's Ctrl-C
does not reach it first. Ready means the READY_LINE in its log, the line sglang prints.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from aiohttp import web
from aiohttp.typedefs import Middleware

from regen.emulator.args import parse_args
from regen.emulator.cli import READY_LINE
from regen.emulator.routes import EmulatorServer
from regen.machine.ports import quiet_port_range
from support import REPO

MODEL_DIR = REPO / "regen" / "data" / "emulator-model"
HOST = "127.0.0.1"


class EmulatorFailed(RuntimeError):
    """The emulator exited or did not print its ready line in time; carries its log's tail."""


@dataclass
class Emulator:
    """One running emulator; subclasses add the calls a test makes to it."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @classmethod
    def launch(
        cls,
        logs: Path,
        *flags: str,
        served_name: str = "emu-model",
        api_key: str | None = None,
        port: int | None = None,
        model_dir: Path = MODEL_DIR,
    ) -> Self:
        """Start one (not waiting for it); its output goes to `logs`/emulator-PORT.log."""
        # Below the ephemeral range: a port found free there can be a client socket's (any
        # process's on this shared machine) by the time the emulator binds it.
        port = quiet_port_range(1) if port is None else port
        log = logs / f"emulator-{port}.log"
        argv = [
            sys.executable, "-m", "regen.emulator", "--model-path", str(model_dir),
            "--served-model-name", served_name, "--host", HOST, "--port", str(port),
            *(["--api-key", api_key] if api_key else []), *flags,
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return cls(proc, port, log)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60, *, deadline: float | None = None) -> None:
        """Until the ready line; raises EmulatorFailed with the log when it exits or times out."""
        deadline = time.monotonic() + timeout if deadline is None else deadline
        while READY_LINE not in self.text():
            if self.proc.poll() is not None:
                raise EmulatorFailed(
                    f"emulator exited {self.proc.returncode}:\n{self.text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise EmulatorFailed(f"emulator {self.url} not ready:\n{self.text()[-2000:]}")
            time.sleep(0.02)

    def metric(self, name: str) -> float:
        """One sample of `name` from /metrics (which sglang serves without the API key)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
        if found is None:
            raise AssertionError(f"{name} not in /metrics of {self.url}")
        return float(found.group(1))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@contextmanager
def emulators(
    logs: Path,
    flags: Sequence[Sequence[str]],
    *,
    timeout: float = 60,
    served_name: str = "emu-model",
    api_key: str | None = None,
    ports: Sequence[int] | None = None,
) -> Iterator[list[Emulator]]:
    """One emulator per entry of `flags`, all ready, all stopped on exit."""
    started: list[Emulator] = []
    try:
        for i, extra in enumerate(flags):
            port = None if ports is None else ports[i]
            started.append(
                Emulator.launch(logs, *extra, served_name=served_name, api_key=api_key, port=port)
            )
        deadline = time.monotonic() + timeout
        for emu in started:
            emu.wait_ready(deadline=deadline)
        yield started
    finally:
        for emu in started:
            emu.stop()


@dataclass
class InProcessEmulator:
    """One emulator app served by this process on 127.0.0.1 (real HTTP, an OS-chosen port):
    no interpreter to start, so a test's fleet is up in milliseconds. Faults that end the
    process (crash-after) need `Emulator`; `stop()` here is the closest: the port closes and
    every open connection drops, as when a server dies."""

    server: EmulatorServer
    runner: web.AppRunner
    port: int
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()


@contextmanager
def in_process(
    flags: Sequence[Sequence[str]],
    *,
    served_name: str = "emu-model",
    api_key: str | None = None,
    middlewares: Sequence[Middleware] = (),
) -> Iterator[list[InProcessEmulator]]:
    """One in-process emulator per entry of `flags`, on one event loop in its own thread;
    `middlewares` run after its own (a test's hook: hold requests, count them)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="emulators", daemon=True)
    thread.start()

    async def up(extra: Sequence[str]) -> InProcessEmulator:
        args = parse_args(
            [
                "--model-path", str(MODEL_DIR), "--served-model-name", served_name,
                "--host", HOST, "--port", "0",
                *(["--api-key", api_key] if api_key else []), *extra,
            ]
        )  # fmt: skip
        server = EmulatorServer(args)
        app = server.make_app()
        app.middlewares.extend(middlewares)
        # A hung request must not hold the stop for aiohttp's default minute.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, HOST, 0).start()
        server.ready = True
        return InProcessEmulator(server, runner, runner.addresses[0][1], loop)

    started: list[InProcessEmulator] = []
    try:
        for extra in flags:
            started.append(asyncio.run_coroutine_threadsafe(up(extra), loop).result())
        yield started
    finally:
        for emu in started:
            emu.stop()
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


async def _cancel_the_rest(wait_s: float = 5.0) -> None:
    """End the handlers a stop left running (a request held in its decode when the port
    closed): a closed loop destroys them pending, and asyncio's "Task was destroyed but it is
    pending!" then lands in whatever test collects them, as if its own code had leaked them."""
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=wait_s)


def hold_port(port: int, timeout_s: float = 60.0) -> socket.socket:
    """Listen on `port` as soon as the server killed on it let it go: a relaunch then fails
    for real (an emulator cannot bind, as SGLang could not)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"port {port} never came free") from None
            time.sleep(0.005)
