"""Prefect's temporary API server for a command-line run, started by regen as the run begins.

Without a configured server, Prefect 3.9.1 starts a temporary one when the flow first calls its
API (`prefect.server.api.server.SubprocessASGIServer`) and waits for it. regen starts the same
command itself, because of what that costs a run (PREFECT_NOTES.md; issue 48):

- Late: Prefect starts it only once the flow is imported and called, then waits ~5 CPU seconds
  (importing the server, building its app, checking the database) with nothing else to do.
  Started before the flow is imported, the two overlap on a second core.
- In the run: Prefect's client imports the server's own code (`prefect.server.api.server`,
  ~2.3 CPU s) only to start it. regen runs Prefect's command in a subprocess and points the
  client at it (PREFECT_API_URL, as any configured server), so the run never imports it.
- Blocks registered on every start: the server imports every installed collection
  (prefect-aws, boto3) to hash its block types, and registers them in the database when the
  hash changed. A run registers no block and loads none from a temporary server (`regen
  blocks register` refuses one), so its server skips both, unless the user set them.
- Its own session: Ctrl-C in a terminal signals the run's process group; the server, in that
  group, died with the first SIGINT and the run then hung on `Error logging to API` for
  minutes. In a session of its own only the run hears the terminal; the run stops the server
  at exit (atexit, registered before Prefect's own, so it runs after them), a forced exit
  stops it at once, and a run killed with -9 leaves it to the next run's reaper
  (`flows.runner`).

- Stopped only once it has recorded the run (`settle`): cut mid-write, it printed tracebacks
  after the run's last line.

A fresh Prefect home still pays the database's creation (every migration, ~10 CPU s) once.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

# Prefect 3.9.1's own environment for its temporary server (server.py, SubprocessASGIServer).
_SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
}
# Block auto-registration off for a temporary server, unless the user said otherwise.
_NO_BLOCK_REGISTRATION = {
    "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
    "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
}
# uvicorn's exit status when the port was taken meanwhile; Prefect starts it again elsewhere.
_PORT_IN_USE = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class TemporaryServer:
    """A Prefect API server of this run's own, in a subprocess of its own session."""

    env: dict[str, str]
    timeout_s: float
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        import prefect

        self.port = _free_port()
        args = [
            sys.executable, "-m", "uvicorn",
            "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--log-level", "error",
            "--lifespan", "on",
        ]  # fmt: skip
        self.process = subprocess.Popen(args, env=self.env, start_new_session=True)
        _point_prefect_at(self.api_url)

    def wait_ready(self) -> None:
        """Until its API answers /health (a port taken meanwhile: once more on another)."""
        deadline = time.monotonic() + self.timeout_s
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                assert self.process is not None
                code = self.process.poll()
                if code == _PORT_IN_USE:
                    self.start()
                    continue
                if code is not None:
                    raise RuntimeError(f"Prefect's temporary API server exited with {code}")
                try:
                    if client.get(f"{self.api_url}/health", timeout=2).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise RuntimeError(
            f"Prefect's temporary API server did not answer within {self.timeout_s:g} s "
            "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)"
        )

    def kill(self) -> None:
        """Stop it at once: a forced exit skips atexit."""
        self.stop(force=True)

    def stop(self, *, force: bool = False) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        if force:
            process.kill()
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_temporary_server() -> TemporaryServer | None:
    """Start the run's temporary Prefect server now, unless a server is configured (an API
    URL from the environment or the profile) or the user turned temporary servers off; the
    caller waits for it (`wait_ready`) before the flow runs. Stopped at exit."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return None
    env = {
        **_NO_BLOCK_REGISTRATION,
        **os.environ,
        **_SERVER_ENV,
        **settings.to_environment_variables(exclude_unset=True),
    }
    server = TemporaryServer(
        env, timeout_s=float(settings.server.ephemeral.startup_timeout_seconds)
    )
    server.start()
    atexit.register(server.stop)
    return server


def _point_prefect_at(api_url: str) -> None:
    """Make `api_url` the API of every Prefect client of this process, as if configured."""
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_API_URL"] = api_url
    # Prefect derives a UI address from a configured API's; a temporary server has no UI (and
    # is gone after the run), so no `View at http://127.0.0.1:.../runs/...` line names one.
    os.environ.setdefault("PREFECT_UI_URL", "")
    refresh_global_settings_context()


def settle(server: TemporaryServer | None, timeout_s: float = 60.0) -> None:
    """Wait until the run's temporary server has recorded every task run it was sent.

    The server writes task-run states from the events the run sends, one write per event, and
    is stopped at exit whether or not it has caught up: a run that ended on a burst of task
    runs (a dead fleet failed 58 shards in one second) had it cut mid-write, and the server
    printed four tracebacks (`Error flushing 1 events`) after the run's last line. Events are
    sent and recorded in order, so once a task run started after the run's last one is
    recorded Completed, the server has nothing left to write and stops cleanly. Bounded by
    `timeout_s` (then it is stopped as before); a no-op without a running temporary server.
    """
    if server is None or server.process is None or server.process.poll() is not None:
        return
    from prefect import get_client, task
    from prefect.cache_policies import NONE
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import ObjectNotFound
    from prefect.logging.loggers import disable_run_logger

    @task(name="regen-settle", persist_result=False, cache_policy=NONE)
    def last_event() -> None:
        """A task run whose events are sent after every other of this process's."""

    with disable_run_logger():  # its own lines would be the run's last
        marked = last_event(return_state=True)
    task_run_id = marked.state_details.task_run_id
    if task_run_id is None:
        return
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            try:
                if client.read_task_run(task_run_id).state_type == StateType.COMPLETED:
                    return
            except ObjectNotFound:
                pass  # not recorded yet: the server is still behind
            time.sleep(0.1)
