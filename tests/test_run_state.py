"""Two runs from one checkout (one work_dir: two models on one 8-GPU node, 4 GPUs each) share no
file: each run's key files, PID files and logs live under `work_dir/runs/<run>/`.

Before, both wrote `secrets/server-<i>.yaml`, `pids/server-<i>.json` and `logs/server-<i>.log`:
one run's servers read the other's key (`answered 401 ... the API key is wrong`) or found it
deleted (`Config file not found`). The reaper still finds what a killed run left, in any run's
directory.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from regen.config import RegenConfig
from regen.fleet import Fleet, build_server_commands, generate_api_key, launch_fleet, reap_orphans
from regen.fleet.commands import run_dir
from regen.fleet.orphans import find_orphans
from regen.machine.ports import port_is_free
from regen.sglang_api.probe import ProbeSettings
from tests.support.fleet import MODEL_DIR, fleet_config, start_owner

FAST = ProbeSettings(generation_timeout_s=5, interval_s=0.1)


def _files(fleet_dir: Path) -> set[Path]:
    return {p for p in fleet_dir.rglob("*") if p.is_file()}


def test_two_fleets_from_one_work_dir_at_once_share_no_file(tmp_path: Path) -> None:
    configs = [fleet_config(tmp_path, 2), fleet_config(tmp_path, 2)]  # distinct base ports
    assert configs[0].work_dir == configs[1].work_dir
    keys = [generate_api_key(), generate_api_key()]
    commands = [
        build_server_commands(config, MODEL_DIR, key, config.work_dir, run_id)
        for config, key, run_id in zip(configs, keys, ["run-a", "run-b"], strict=True)
    ]
    paths = [{p for c in cmds for p in (c.key_file, c.pid_path, c.log_path)} for cmds in commands]
    assert not paths[0] & paths[1]
    assert all(str(p).startswith(str(run_dir(configs[0].work_dir, "run-a"))) for p in paths[0])

    def launch(i: int) -> Fleet:
        return launch_fleet(configs[i], commands[i], keys[i], probe_settings=FAST, grace_s=3)

    # Launched at the same moment: each server must read its own run's key.
    with ThreadPoolExecutor(2) as pool:
        fleets = list(pool.map(launch, [0, 1]))
    try:
        for fleet in fleets:
            assert [r.status for r in fleet.report] == ["healthy", "healthy"], fleet.report
        logs = [{c.log_path for c in cmds} for cmds in commands]
        assert all(p.is_file() for p in logs[0] | logs[1])
    finally:
        for fleet in fleets:
            fleet.teardown()
    # Each teardown removed its own PID and key files, and only those.
    for i in (0, 1):
        left = _files(run_dir(configs[i].work_dir, f"run-{'ab'[i]}"))
        assert {p.parent.name for p in left} == {"logs"}, left


OWNER = """
import json, sys, time
from pathlib import Path
from regen.config import parse_config
from regen.fleet import build_server_commands, generate_api_key, launch_fleet
from regen.sglang_api.probe import ProbeSettings
config = parse_config(json.loads(Path(sys.argv[1]).read_text()))
key = generate_api_key()
commands = build_server_commands(config, config.model.staged_path(), key, config.work_dir, "dead")
fleet = launch_fleet(config, commands, key, probe_settings=ProbeSettings(interval_s=0.1))
print(json.dumps({"ports": [c.port for c in commands]}), flush=True)
while True:
    time.sleep(0.1)
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(120)
def test_the_reaper_finds_a_killed_runs_servers_in_its_run_directory(tmp_path: Path) -> None:
    config: RegenConfig = fleet_config(tmp_path, 2)
    owner, fleet = start_owner(tmp_path, config, OWNER)
    try:
        assert reap_orphans(config.work_dir) == []  # its owner lives: another run's, not ours
        owner.kill()
        owner.wait(timeout=5)
        found = find_orphans(config.work_dir)
        assert {o.path.parent.parent for o in found} == {run_dir(config.work_dir, "dead")}
        assert sorted(reap_orphans(config.work_dir)) == sorted(fleet["pids"])
        assert all(_gone(p) for p in fleet["pids"])
        assert all(port_is_free("127.0.0.1", p) for p in fleet["ports"])
        left = _files(run_dir(config.work_dir, "dead"))
        assert {p.parent.name for p in left} == {"logs"}, left  # the key files went too
    finally:
        if owner.poll() is None:
            owner.kill()
        reap_orphans(config.work_dir)
