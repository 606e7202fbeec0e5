"""One server process: started in its own process group, recorded in a PID file, stopped whole.

The PID file and the `REGEN_FLEET_ID` marker in the child's environment are what let a
later run find and stop servers whose owner was killed with SIGKILL, and only those.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from regen.fleet.commands import ServerCommand
from regen.machine.owned import group_alive, signal_group

FLEET_ID_ENV = "REGEN_FLEET_ID"
_TAIL_BYTES = 1 << 20


def write_private(path: Path, data: bytes, *, append: bool = False) -> None:
    """Write a file only this user can read (the key file, logs that may echo launch args)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = os.O_APPEND if append else os.O_TRUNC
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# `'api_key': 'K'` (the args dict 0.5.23 logs) and `--api-key K` (its launch_command).
_KEY_VALUE = re.compile(r"""(api_key['"]?\s*[:=]\s*)(['"])(?:(?!\2).)*\2""")
_KEY_FLAG = re.compile(r"(--(?:admin-)?api-key[ =])\S+")


def redact(text: str, key: str) -> str:
    """`text` without `key` or any value a server logs under an API-key name."""
    text = text.replace(key, "***") if key else text
    text = _KEY_VALUE.sub(r"\1\2***\2", text)
    return _KEY_FLAG.sub(r"\1***", text)


@dataclass
class ServerProcess:
    """A started server: its command, its Popen and when it started."""

    command: ServerCommand
    popen: subprocess.Popen[bytes]
    started_mono: float
    log_offset: int = 0  # where this start's lines begin in the (appended) log

    @classmethod
    def start(
        cls,
        command: ServerCommand,
        fleet_id: str,
        on_started: Callable[[ServerProcess], None] = lambda _: None,
    ) -> ServerProcess:
        """Write the key file, start the server in a new session, record its PID file and hand
        it to `on_started` (the fleet's list, which teardown stops). A Ctrl-C between the spawn
        and that hand-over would leave a server in a session of its own that no one knows to
        stop: the group is killed on the way out instead."""
        write_private(
            command.key_file,
            yaml.safe_dump({"api-key": command.api_key.get_secret_value()}).encode(),
        )
        # Appended, never emptied: a rerun keeps the lines that say why the last run died.
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        header = f"\n===== regen: {command.name} starting at {stamp}, fleet {fleet_id} =====\n"
        write_private(command.log_path, header.encode(), append=True)
        offset = command.log_path.stat().st_size
        env = {**os.environ, **command.env, FLEET_ID_ENV: fleet_id}
        with open(command.log_path, "ab") as log:
            popen = subprocess.Popen(
                command.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: teardown signals every child it forks
                close_fds=True,
            )
        try:
            return cls._recorded(command, fleet_id, popen, offset, on_started)
        except BaseException:
            signal_group(popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=5)
            command.pid_path.unlink(missing_ok=True)
            raise

    @classmethod
    def _recorded(
        cls,
        command: ServerCommand,
        fleet_id: str,
        popen: subprocess.Popen[bytes],
        offset: int,
        on_started: Callable[[ServerProcess], None],
    ) -> ServerProcess:
        started = time.time()
        owner = psutil.Process()
        record: dict[str, Any] = {
            "pid": popen.pid,
            "pgid": popen.pid,
            "argv": command.argv,  # no secret: the key is in the --config file
            "host": command.host,
            "port": command.port,
            "started_at": started,
            "fleet_id": fleet_id,
            "owner_pid": owner.pid,
            "owner_started_at": owner.create_time(),
        }
        write_private(command.pid_path, json.dumps(record, indent=2).encode())
        process = cls(command, popen, started_mono=time.monotonic(), log_offset=offset)
        on_started(process)
        return process

    def record_cmdline(self) -> None:
        """Add the server's own command line to its PID file, read once it is up: engine.python
        may be a wrapper that execs, so argv is what was asked and this is what runs."""
        try:
            cmdline = psutil.Process(self.pid).cmdline()
            record = json.loads(self.command.pid_path.read_text())
        except (psutil.Error, OSError, ValueError):
            return
        record["cmdline"] = cmdline
        write_private(self.command.pid_path, json.dumps(record, indent=2).encode())

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        """The exit status once the server process has ended, else None (never blocks)."""
        return self.popen.poll()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log, redacted: it ends up in errors and the fleet report.

        sglang 0.5.23 logs every resolved argument, `api_key` in clear (and an admin key given
        in engine.extra_args): blank our key wherever it shows, and any key-named value."""
        try:
            with open(self.command.log_path, "rb") as f:
                # Only the end is read: a three-day server's log is large.
                f.seek(max(self.log_offset, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
                tail = deque(f, maxlen=lines)
        except OSError:
            return "(no log)"
        text = b"".join(tail).decode("utf-8", "replace").rstrip()
        return redact(text, self.command.api_key.get_secret_value())

    def terminate(self) -> None:
        """SIGTERM the launcher alone: SGLang then stops its own children (scheduler,
        detokenizer) on its graceful path; signalling the group at once sends it down its
        crash path (`scheduler crashed with exit code -15`, then a 5 s sleep)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGTERM)

    def terminate_group(self) -> None:
        signal_group(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        signal_group(self.pid, signal.SIGKILL)

    def wait_gone(self, deadline: float) -> bool:
        """Reap the leader and wait for the whole group to go, until `deadline` (monotonic)."""
        while True:
            # Always with a timeout: Popen.wait without one takes a lock a signal handler
            # calling teardown on this same thread would deadlock on.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=max(0.0, min(0.05, deadline - time.monotonic())))
            if self.popen.returncode is not None and not group_alive(self.pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def remove_files(self) -> None:
        self.command.pid_path.unlink(missing_ok=True)
        self.command.key_file.unlink(missing_ok=True)


# Of the grace period, the share the launcher's own shutdown gets before the whole group is
# signalled; the rest is for the group's SIGTERM before SIGKILL.
_GRACEFUL_SHARE = 0.7


def stop_processes(processes: list[ServerProcess], grace_s: float) -> list[ServerProcess]:
    """SIGTERM every launcher and wait for its own shutdown, then SIGTERM what is left of each
    group, SIGKILL what is left after `grace_s` in all; return any that survived."""
    start = time.monotonic()
    for proc in processes:
        proc.terminate()
    deadline = start + grace_s * _GRACEFUL_SHARE
    lingering = [p for p in processes if not p.wait_gone(deadline)]
    for proc in lingering:
        proc.terminate_group()
    deadline = start + grace_s
    stubborn = [p for p in lingering if not p.wait_gone(deadline)]
    for proc in stubborn:
        proc.kill()
    deadline = time.monotonic() + 5.0
    survivors = [p for p in stubborn if not p.wait_gone(deadline)]
    for proc in processes:
        if proc not in survivors:
            proc.remove_files()
    return survivors
