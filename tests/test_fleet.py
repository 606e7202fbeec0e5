"""The fleet against real emulator processes: launch, probes, policy, teardown, orphans."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import SecretStr

from regen.config import RegenConfig
from regen.errors import ConfigError, FleetError, FleetUnauthorized, UserError
from regen.fleet import (
    Fleet,
    FleetPortInUse,
    attach_fleet,
    benchmark_fleet,
    build_server_commands,
    generate_api_key,
    launch_fleet,
    reap_orphans,
)
from regen.fleet.commands import ServerCommand
from regen.fleet.process import FLEET_ID_ENV, ServerProcess, stop_processes
from regen.fleet.report import FLEET_KEY, FleetRow, flag_slow
from regen.fleet.up import bring_up_fleet
from regen.machine.owned import group_alive
from regen.machine.ports import port_is_free
from regen.preflight import check_ports
from regen.sglang_api.probe import ProbeSettings
from regen.storage import LocalStorage
from tests.support.fleet import MODEL_DIR, fleet_config, server_pids, start_owner

FAST = ProbeSettings(generation_timeout_s=5, interval_s=0.1)


def _launch(config: RegenConfig, **kw: object) -> Fleet:
    key = generate_api_key()
    commands = build_server_commands(config, MODEL_DIR, key, config.work_dir)
    return launch_fleet(config, commands, key, probe_settings=FAST, grace_s=3, **kw)  # type: ignore[arg-type]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _signals(call: Callable[[], None]) -> list[tuple[str, tuple[int, int]]]:
    """The `os.kill` and `os.killpg` calls (pid or group, signal) made while `call` runs, on
    any thread, as Python's audit events report them (the real calls, not a stand-in)."""
    seen: list[tuple[str, tuple[int, int]]] = []
    listening = threading.Event()

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if listening.is_set() and event in ("os.kill", "os.killpg"):
            seen.append((event, (args[0], args[1])))

    sys.addaudithook(hook)  # a hook stays for the process's life: this one only while set
    listening.set()
    try:
        call()
    finally:
        listening.clear()
    return seen


def _assert_stopped(config: RegenConfig, pids: list[int], ports: list[int]) -> None:
    assert pids and all(_gone(p) for p in pids)
    assert all(port_is_free("127.0.0.1", p) for p in ports)
    assert not list((config.work_dir / "pids").glob("*.json"))
    assert not list((config.work_dir / "secrets").glob("*.yaml"))


def test_four_servers_come_up_measured_and_go_away(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 4, engine={"extra_args": ["--cuda-graph-max-bs-decode", "8"]})
    fleet = _launch(config)
    with fleet:
        assert [e.name for e in fleet.endpoints] == [f"server-{i}" for i in range(4)]
        assert [r.status for r in fleet.report] == ["healthy"] * 4
        secret = fleet.api_key.get_secret_value()
        pids = server_pids([r.port for r in fleet.report])
        assert len(pids) == 4
        for pid in pids:
            proc = psutil.Process(pid)
            assert not any(secret in a for a in proc.cmdline())
            assert FLEET_ID_ENV in proc.environ()
            assert os.getpgid(pid) == pid
        record = json.loads((config.work_dir / "pids" / "server-0.json").read_text())
        assert record["pid"] == pids[0] and record["argv"][1:3] == ["-m", "regen.emulator"]
        # What runs, read once it is up (engine.python may be a wrapper that execs).
        assert record["cmdline"] == psutil.Process(pids[0]).cmdline()
        # The key file is gone once the server is up: it was read at argument parsing.
        assert not list((config.work_dir / "secrets").glob("*.yaml"))

        rows = benchmark_fleet(fleet, concurrency=4, max_tokens=32, budget_s=10)
        assert len(rows) == 4 and rows == fleet.report
        for row in rows:
            assert row.tok_s and row.tok_s > 0
            assert row.first_response_s is not None and row.accept_length == pytest.approx(3.6)
            assert row.startup_s and row.probe_latency_s is not None
            json.dumps(row.model_dump(mode="json"))
        assert asyncio.run(fleet.reprobe(fleet.endpoints[1]))
        ports = [r.port for r in rows]

        def three_at_once() -> None:
            # Teardown from several threads at once (a Prefect hook, a finally, atexit).
            threads = [threading.Thread(target=fleet.teardown) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=20)

        # Each launcher gets its SIGTERM once: a teardown whose threads each stopped the
        # fleet would send three (and, late, to PIDs that may be another process's by then).
        sent = _signals(three_at_once)
        terms = sorted(a for e, a in sent if e == "os.kill")
        assert terms == sorted((p, signal.SIGTERM) for p in pids)
        _assert_stopped(config, pids, ports)  # type: ignore[arg-type]
    # Idempotent: the `with` exit and this call signal nothing more, not even the pids
    # regen started (by now they may be an unrelated process's).
    assert _signals(fleet.teardown) == []
    _assert_stopped(config, pids, ports)  # type: ignore[arg-type]
    assert not asyncio.run(fleet.reprobe(fleet.endpoints[1]))


def test_fail_startup_names_the_server_with_its_log_tail_at_once(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 2, server_faults={1: ["fail-startup"]})
    key = generate_api_key()
    commands = build_server_commands(config, MODEL_DIR, key, config.work_dir)
    with pytest.raises(FleetError) as err:
        launch_fleet(config, commands, key, probe_settings=FAST, grace_s=3)
    raised = time.time()
    message = str(err.value)
    assert "server-1" in message and "exited with code 1" in message
    assert "fail-startup: the model failed to load" in message  # the log tail
    # The server logged its arguments as 0.5.23 does, key in clear: the tail shown is redacted.
    secret = key.get_secret_value()
    log_file = config.work_dir / "logs" / "server-1.log"
    assert secret in log_file.read_text() and log_file.stat().st_mode & 0o077 == 0
    assert secret not in message and "'api_key': '***'" in message
    assert "server-0 (" not in message.split("\n", 1)[0]
    exited = (config.work_dir / "logs" / "server-1.log").stat().st_mtime
    # At once: well inside the 30 s startup deadline, which a launch that waited it out
    # would have used up (a bound a loaded machine cannot reach, unlike the 2 s it was).
    assert raised - exited < config.engine.startup_timeout_s / 2
    assert port_is_free("127.0.0.1", config.engine.base_port)


def test_missing_interpreter_is_a_config_error_naming_engine_python(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 2, engine={"python": str(tmp_path / "no-venv" / "python")})
    with pytest.raises(ConfigError, match=r"engine\.python: cannot start .*no-venv"):
        _launch(config)


def test_a_server_below_half_the_median_speed_is_flagged() -> None:
    rows = [
        FleetRow(server=f"server-{i}", gpu=i, port=1 + i, url="u", status="healthy", tok_s=s)
        for i, s in enumerate([250.0, 240.0, 110.0, 260.0])
    ]
    rows.append(FleetRow(server="server-4", gpu=4, port=5, url="u", status="exited"))
    flagged = flag_slow(rows, 0.5)
    assert [r.flagged for r in flagged] == [False, False, True, False, False]
    assert "below 0.5 x median 245" in flagged[2].reason
    assert "FLAGGED" in flagged[2].summary()


def test_no_ready_times_out_at_the_deadline(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 1, server_faults={0: ["no-ready"]})
    start = time.monotonic()
    with pytest.raises(FleetError, match=r"server-0.*timed_out.*not ready within 2 s"):
        _launch(config, startup_timeout_s=2)
    took = time.monotonic() - start
    # It waited out its deadline (a lower bound no load can break) and no more than the
    # config's own 30 s: a launch that ignored the deadline it was given would wait that one.
    assert 2.0 <= took < config.engine.startup_timeout_s


def test_hung_scheduler_fails_the_generation_probe_though_health_is_200(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 1, server_faults={0: ["hang-after=0"]})
    key = generate_api_key()
    commands = build_server_commands(config, MODEL_DIR, key, config.work_dir)
    with pytest.raises(FleetError) as err:
        # A hung server does not finish its in-flight request on SIGTERM: keep the grace short.
        settings = ProbeSettings(generation_timeout_s=1)
        launch_fleet(config, commands, key, probe_settings=settings, grace_s=1)
    assert "generation probe timed out after 1 s although /health answered 200" in str(err.value)


def test_wrong_key_is_a_config_error(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 1)
    commands = build_server_commands(config, MODEL_DIR, SecretStr("right"), config.work_dir)
    with pytest.raises(FleetUnauthorized, match=r"server-0.*401"):
        launch_fleet(config, commands, SecretStr("wrong"), probe_settings=FAST)
    assert port_is_free("127.0.0.1", commands[0].port)


def test_taken_port_fails_before_anything_starts(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 3)
    taken = config.engine.base_port + 1
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        with pytest.raises(FleetPortInUse) as err:
            _launch(config)
    assert isinstance(err.value, UserError)
    assert f"port {taken} (server-1)" in str(err.value) and "\n" not in str(err.value)
    assert not (config.work_dir / "logs").exists()


def test_min_servers_goes_on_without_the_failed_one(tmp_path: Path) -> None:
    config = fleet_config(
        tmp_path, 4, server_faults={2: ["fail-startup"]}, engine={"min_servers": 3}
    )
    fleet = _launch(config)
    assert [e.name for e in fleet.endpoints] == ["server-0", "server-1", "server-3"]
    failed = fleet.report[2]
    assert failed.status == "exited" and "fail-startup" in failed.reason
    assert not (config.work_dir / "pids" / "server-2.json").exists()
    ports = [r.port for r in fleet.report]
    pids = server_pids(ports)
    assert len(pids) == 3
    with pytest.raises(RuntimeError), fleet:  # an exception in the `with` still tears down
        raise RuntimeError("the run failed")
    _assert_stopped(config, pids, ports)  # type: ignore[arg-type]


def test_attach_probes_external_servers_and_never_stops_them(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 1)
    with _launch(config) as owned:
        external = fleet_config(
            tmp_path / "ext", 1, kind="external", engine={"urls": [owned.endpoints[0].url]}
        )
        before = psutil.Process().children()
        attached = attach_fleet(external, owned.api_key, probe_settings=FAST)
        assert [r.status for r in attached.report] == ["healthy"]
        assert psutil.Process().children() == before  # it started no server
        attached.teardown()
        assert not port_is_free("127.0.0.1", owned.report[0].port or 0)


OWNER = """
import json, sys, time
from pathlib import Path
from regen.config import parse_config
from regen.fleet import build_server_commands, generate_api_key, launch_fleet
from regen.sglang_api.probe import ProbeSettings
from regen.storage import LocalStorage
config = parse_config(json.loads(Path(sys.argv[1]).read_text()))
key = generate_api_key()
commands = build_server_commands(config, config.model.staged_path(), key, config.work_dir)
fleet = launch_fleet(config, commands, key, probe_settings=ProbeSettings(interval_s=0.1))
print(json.dumps({"ports": [c.port for c in commands]}), flush=True)
while True:
    time.sleep(0.1)
"""


def test_kill_9_of_the_owner_leaves_orphans_the_next_run_reaps(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 2)
    owner, fleet = start_owner(tmp_path, config, OWNER)
    assert reap_orphans(config.work_dir) == []  # its owner is alive: not an orphan
    assert check_ports(config).status == "fail"  # a live run's ports: not ours to take
    owner.kill()
    owner.wait(timeout=5)
    assert not any(_gone(p) for p in fleet["pids"])  # own sessions: they outlive the owner
    # regen check names them as the earlier run's, with their pids, and who stops them.
    row = check_ports(config)
    assert row.status == "warn", row
    for pid, port in zip(fleet["pids"], fleet["ports"], strict=True):
        assert f"(port {port}): pid {pid}" in row.figure
    assert "earlier run's servers" in row.figure and "regen run stops them" in (row.hint or "")
    assert sorted(reap_orphans(config.work_dir)) == sorted(fleet["pids"])
    _assert_stopped(config, fleet["pids"], fleet["ports"])


def test_an_unrelated_process_behind_a_stale_pid_file_survives(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pids = tmp_path / "pids"
        pids.mkdir()
        (pids / "server-0.json").write_text(
            json.dumps(
                {
                    "pid": bystander.pid,
                    "pgid": bystander.pid,
                    "argv": [sys.executable, "-m", "regen.emulator"],
                    "port": 1,
                    "started_at": time.time(),
                    "fleet_id": "an-earlier-run",
                    "owner_pid": 2**22 + 1,
                    "owner_started_at": 0,
                }
            )
        )
        assert reap_orphans(tmp_path) == []
        assert bystander.poll() is None
        assert not (pids / "server-0.json").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_bring_up_tears_the_fleet_down_when_publishing_it_fails(tmp_path: Path) -> None:
    """Attach-or-launch and teardown are regen's (tasks/setup.py only publishes): a fleet
    whose report cannot be published is stopped before the error goes on."""
    config = fleet_config(
        tmp_path, 2, engine={"bench": {"concurrency": 2, "max_tokens": 8, "budget_s": 5}}
    )
    launched: list[int] = []
    seen: list[Fleet] = []
    pids: list[int] = []

    def publish(fleet: Fleet) -> None:
        seen.append(fleet)
        pids.extend(server_pids(launched))
        raise OSError("artifact store down")

    storage = LocalStorage(tmp_path / "out")
    with pytest.raises(OSError, match="artifact store down"):
        bring_up_fleet(
            config, MODEL_DIR, generate_api_key(), storage,
            on_launch=lambda commands: launched.extend(c.port for c in commands),
            on_ready=publish,
        )  # fmt: skip
    assert len(launched) == 2 and len(seen) == 1
    assert [r.status for r in seen[0].report] == ["healthy", "healthy"]
    # Each server's own limits, from its /server_info: what the tuner keeps under.
    assert all(r.max_running_requests and r.kv_tokens for r in seen[0].report), seen[0].report
    assert storage.exists(FLEET_KEY)
    _assert_stopped(config, pids, launched)


def test_a_relaunch_keeps_the_earlier_server_log(tmp_path: Path) -> None:
    """The log is the evidence of why a run died: a resumed run appends, never empties it,
    and the failure tail it reports is its own start's."""
    config = fleet_config(tmp_path, 1)
    with _launch(config):
        pass
    log = config.work_dir / "logs" / "server-0.log"
    first = log.read_text()
    assert "starting at" in first and "fired up" in first
    with _launch(config) as fleet:
        assert fleet.report[0].status == "healthy"
    text = log.read_text()
    assert text.startswith(first) and text.count("===== regen: server-0 starting at") == 2


CHILD = """
import signal, sys, time
def note(what):
    with open(sys.argv[1], "a") as f:
        f.write(what + "\\n")
signal.signal(signal.SIGTERM, lambda *a: (note("child: SIGTERM"), sys.exit(0)))
signal.signal(signal.SIGUSR1, lambda *a: (note("child: asked by its launcher"), sys.exit(0)))
note("child: up")
while True:
    time.sleep(0.05)
"""

LAUNCHER = """
import signal, subprocess, sys, time
out = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", sys.argv[2], out])
def shutdown(*_):
    with open(out, "a") as f:
        f.write("launcher: SIGTERM\\n")
    child.send_signal(signal.SIGUSR1)
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, shutdown)
while True:
    time.sleep(0.05)
"""


def test_teardown_lets_the_launcher_stop_its_children_first(tmp_path: Path) -> None:
    """SGLang's launcher stops its scheduler on SIGTERM; a SIGTERM to the whole group at once
    sends the scheduler down its crash path instead."""
    out = tmp_path / "notes.txt"
    command = ServerCommand(
        index=0, gpu=None, host="127.0.0.1", port=1,
        argv=[sys.executable, "-c", LAUNCHER, str(out), CHILD],
        env={}, log_path=tmp_path / "server-0.log", pid_path=tmp_path / "server-0.json",
        key_file=tmp_path / "server-0.yaml", api_key=SecretStr("k"),
    )  # fmt: skip
    proc = ServerProcess.start(command, "fleet")
    deadline = time.monotonic() + 10
    while "child: up" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline and proc.exit_code() is None
        time.sleep(0.02)
    assert stop_processes([proc], grace_s=5) == []
    assert out.read_text().splitlines() == [
        "child: up",
        "launcher: SIGTERM",
        "child: asked by its launcher",
    ]


def test_a_ctrl_c_as_a_server_starts_leaves_no_server_behind(tmp_path: Path) -> None:
    """A KeyboardInterrupt between the spawn and the fleet's list learning of it (CI once
    caught a Ctrl-C there: a server in a session of its own outlived the run): its group is
    killed and its PID file removed on the way out."""
    out = tmp_path / "notes.txt"
    command = ServerCommand(
        index=0, gpu=None, host="127.0.0.1", port=1,
        argv=[sys.executable, "-c", LAUNCHER, str(out), CHILD],
        env={}, log_path=tmp_path / "server-0.log", pid_path=tmp_path / "server-0.json",
        key_file=tmp_path / "server-0.yaml", api_key=SecretStr("k"),
    )  # fmt: skip
    spawned: list[int] = []

    def interrupted(process: ServerProcess) -> None:
        spawned.append(process.pid)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ServerProcess.start(command, "fleet", on_started=interrupted)
    assert spawned and not psutil.pid_exists(spawned[0])
    assert not group_alive(spawned[0]) and not command.pid_path.exists()
