"""Prefect on loopback: the env a client runs with, a real server and process worker started and
stopped for sure, and waiting for a flow run to end.

`prefect worker start` ignores SIGTERM (PREFECT_NOTES.md), so the worker gets its own process
group: two SIGINTs stop it cleanly, and a SIGKILL to the group is the fallback that also takes
any flow-run subprocess it left behind. Every stop asserts that the processes are gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from regen.machine.ports import quiet_port_range

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun

PREFECT = str(Path(sys.executable).parent / "prefect")


def prefect_env(home: Path, api_url: str | None = None) -> dict[str, str]:
    """This process's environment without any PREFECT_* of the caller's, pointed at `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONUNBUFFERED="1",
    )
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    return env


@dataclass
class Server:
    """A running `prefect server start`; `env` is what a client of it runs with."""

    process: subprocess.Popen[bytes]
    api_url: str
    env: dict[str, str]
    log: Path

    @property
    def home(self) -> Path:
        """Its PREFECT_HOME (the log is written there)."""
        return self.log.parent

    def env_now(self) -> dict[str, str]:
        """`env` from this process's environment as it is now, not as it was at the start."""
        return prefect_env(self.home, self.api_url)

    def prefect(
        self, *args: str, cwd: Path, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`prefect ARGS` against this server; raises with the CLI's output when it fails."""
        done = subprocess.run(
            [PREFECT, *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"prefect {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def client(self) -> SyncPrefectClient:
        """A client of this server's API (Prefect imported here: a bench's start stays light)."""
        from prefect.client.orchestration import SyncPrefectClient

        return SyncPrefectClient(api=self.api_url)

    def wait_final(self, run_id: str, timeout: float, poll_s: float = 0.5) -> FlowRun:
        """The flow run once its state is final, or as last seen when `timeout` ran out
        (the caller says what a timeout means: a failed test, a bench's "TimedOut")."""
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                run = client.read_flow_run(uuid.UUID(run_id))
                if (run.state is not None and run.state.is_final()) or time.monotonic() > deadline:
                    return run
                time.sleep(poll_s)


class PortTaken(Exception):
    """Another server answered on the port this one was started on (two test workers once drew
    the same port: the second's client then talked to the first's API)."""


def _listens(pid: int, port: int) -> bool:
    """Whether `pid` or one of its children listens on `port`."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return False
    for proc in procs:
        with suppress(psutil.Error):
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                    return True
    return False


def _wait_healthy(
    process: subprocess.Popen[bytes], api_url: str, log: Path, timeout: float, port: int = 0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = log.read_text(errors="replace")
            if port and "already in use" in said.lower():  # prefect's words, or the bind's
                raise PortTaken(api_url)
            raise AssertionError(f"prefect server exited {process.returncode}:\n{said}")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as resp:
                if resp.status == 200:
                    if port and not _listens(process.pid, port):
                        raise PortTaken(api_url)
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"prefect server not healthy after {timeout:.0f} s:\n{log.read_text()}")


def _assert_gone(pids: list[int], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and not _is_zombie(p)]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: processes still alive: {alive}")


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _tree(pid: int) -> list[int]:
    try:
        proc = psutil.Process(pid)
        return [pid, *(c.pid for c in proc.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


@contextmanager
def prefect_server(home: Path, startup_timeout: float = 90) -> Iterator[Server]:
    """`prefect server start` on a free loopback port, its own PREFECT_HOME; SIGTERM stops it."""
    log = home / "server.log"
    home.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = quiet_port_range(1)
        api_url = f"http://127.0.0.1:{port}/api"
        # The UI asks port 4200 for its API unless told otherwise: its pages would load but
        # stay empty on any other port (tools/ui_screenshots.py looks at them).
        env = {**prefect_env(home), "PREFECT_UI_API_URL": api_url}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_healthy(process, api_url, log, startup_timeout, port)
            break
        except BaseException as err:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            if not isinstance(err, PortTaken) or attempt == 2:
                raise
    try:
        yield Server(process, api_url, prefect_env(home, api_url), log)
    finally:
        pids = _tree(process.pid)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        _assert_gone(pids, "prefect server")


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path


def stop_worker(worker: Worker, grace: float = 15) -> None:
    """Two SIGINTs to the worker's group (it ignores SIGTERM), then SIGKILL; assert all gone."""
    process = worker.process
    pids = _tree(process.pid)
    for _ in range(2):
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGINT)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left, flow runs included
    process.wait(timeout=10)
    _assert_gone(pids, "prefect worker")


@contextmanager
def prefect_worker(
    server: Server, pool: str, cwd: Path, log: Path, extra_env: dict[str, str] | None = None
) -> Iterator[Worker]:
    """`prefect worker start --pool POOL` polling every second, in its own process group."""
    env = {**server.env, "PREFECT_WORKER_QUERY_SECONDS": "1", **(extra_env or {})}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", pool],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = Worker(process, log)
    try:
        yield worker
    finally:
        stop_worker(worker)
