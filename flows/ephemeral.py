"""Prefect's temporary API server, kept out of the terminal's process group, and stopped only
once it has recorded the run (`settle_ephemeral_server`).

Without a configured server, Prefect 3.9.1 starts a temporary one in a subprocess of the run
(`prefect.server.api.server.SubprocessASGIServer`), in the run's own process group. Ctrl-C in a
terminal signals that whole group, so the server died with the first SIGINT and the run, still
unwinding, then hung on `Error logging to API` / `httpx.ConnectError` for minutes. Here the
server is started in a session of its own: only the run hears the terminal, the server lives
until the run stops it at exit (Prefect's own atexit), and a run killed with -9 leaves it to
the next run's reaper (`flows.runner`), as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from prefect import get_client, task
from prefect.cache_policies import NONE
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.logging.loggers import disable_run_logger
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings


class _OwnSessionServer(SubprocessASGIServer):
    """Prefect's temporary server, started with `start_new_session=True`."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        # Prefect 3.9.1's own command and environment (server.py, SubprocessASGIServer), with
        # one change: its own session, so a terminal's SIGINT to the run's group misses it.
        import prefect

        server_env = {
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        args = [
            sys.executable, "-m", "uvicorn",
            "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--log-level", "error",
            "--lifespan", "on",
        ]  # fmt: skip
        return subprocess.Popen(
            args=args,
            env={
                **os.environ,
                **server_env,
                **get_current_settings().to_environment_variables(exclude_unset=True),
            },
            start_new_session=True,
        )


def detach_ephemeral_server() -> None:
    """Make the temporary server this process will start (if any) one in its own session.

    Prefect looks its server up as `SubprocessASGIServer()` (one instance per port, None for
    "any free port"); registering ours under that key first makes every later lookup get it.
    A no-op when a server is configured (PREFECT_API_URL) or one was already started.
    """
    if get_current_settings().api.url:
        return
    if None not in SubprocessASGIServer._instances:
        _OwnSessionServer()


@task(name="regen-settle", persist_result=False, cache_policy=NONE)
def _last_event() -> None:
    """A task run whose events are sent after every other of this process's."""


def settle_ephemeral_server(timeout_s: float = 60.0) -> None:
    """Wait until this process's temporary server has recorded every task run it was sent.

    The server writes task-run states from the events the run sends, one write per event, and
    Prefect stops it at exit whether or not it has caught up: a run that ended on a burst of
    task runs (a dead fleet failed 58 shards in one second) had it cut mid-write, and the
    server printed four tracebacks (`Error flushing 1 events`) after the run's last line.
    Events are sent and recorded in order, so once a task run started after the run's last
    one is recorded Completed, the server has nothing left to write and stops cleanly.
    Bounded by `timeout_s` (then it is stopped as before); a no-op without a temporary server.
    """
    server = SubprocessASGIServer._instances.get(None)
    process = server.server_process if server is not None else None
    if process is None or process.poll() is not None:
        return
    with disable_run_logger():  # its own lines would be the run's last
        marked = _last_event(return_state=True)
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


def stop_ephemeral_server() -> None:
    """Stop this process's temporary server now (a forced exit skips Prefect's atexit)."""
    server = SubprocessASGIServer._instances.get(None)
    process = server.server_process if server is not None else None
    if process is not None and process.poll() is None:
        process.kill()
