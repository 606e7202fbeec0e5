"""Servers listen on loopback and demand a key; no secret and no prompt text leaves the dataset.

One real rehearsal runs with a known API key, AWS-looking secrets in its environment and a
marker planted in a few prompts. While it runs, the process table is sampled for the key in
any command line, the servers' listening sockets are read, and each server is asked for
/v1/models without the key. Afterwards every file the run wrote (work dir, output, Prefect's
own database) and everything it printed is scanned for the three strings.

Where prompt text belongs by design, and so is not scanned for the marker:
- `out/shards/*.parquet`: the dataset itself (messages + completion per row);
- `.regen/prompts/*.parquet`: the validated prompt cache the shard tasks read;
- `out/canary/*.parquet`: the canary's rows, dataset rows held until their shards commit;
- the user's own inputs (the prompts file and the config file that holds the key).
Environment variables are not scanned: the servers inherit the user's environment (the AWS
variables) by design, and the key travels in a 0600 file, so `environ` may hold secrets that
`ps` does not show; the test reports what it saw there.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import psutil
import pytest
from pydantic import SecretStr

from regen.config import parse_config
from regen.dataset import read_committed
from regen.errors import ConfigError
from regen.fleet.commands import build_server_commands
from regen.rehearsal import bundled
from regen.storage import LocalStorage
from support import REPO
from tests.support.bad_input import base_config, write_yaml
from tests.support.cli import regen_env

pytestmark = pytest.mark.timeout(400)

API_KEY = "regen-test-key-7f3a9c1e5b"
AWS_SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYTESTSECRET"
AWS_SESSION = "FwoGZXIvYXdzEXAMPLE-session-token-91ab"
MARKER = "PLANTED-PROMPT-MARKER-5e8d"
NEEDLES = {"api key": API_KEY, "aws secret": AWS_SECRET, "aws token": AWS_SESSION}


# --- binding and key policy, from the config and the commands ---------------------------------


def test_servers_bind_loopback_by_default(tmp_path: Path) -> None:
    config = parse_config(base_config(tmp_path, engine={"kind": "emulator", "gpus": [0, 1]}))
    for command in build_server_commands(config, tmp_path, SecretStr(API_KEY), tmp_path):
        host = command.argv[command.argv.index("--host") + 1]
        assert host == "127.0.0.1" and command.url.startswith("http://127.0.0.1:")
        assert API_KEY not in " ".join(command.argv)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_other_hosts_require_an_api_key(tmp_path: Path, host: str) -> None:
    with pytest.raises(
        ConfigError, match=rf"engine.host {host} is not loopback: set engine.api_key"
    ):
        parse_config(base_config(tmp_path, engine={"kind": "emulator", "host": host}))
    engine = {"kind": "emulator", "host": host, "api_key": API_KEY}
    config = parse_config(base_config(tmp_path, engine=engine))
    (command,) = build_server_commands(
        config, tmp_path, config.engine.api_key or SecretStr(""), tmp_path
    )
    assert command.argv[command.argv.index("--host") + 1] == host
    assert API_KEY not in " ".join(command.argv) and API_KEY not in repr(command)
    assert "--config" in command.argv  # the key goes through a file, not the command line


def test_config_never_prints_the_key(tmp_path: Path) -> None:
    config = parse_config(base_config(tmp_path, engine={"kind": "emulator", "api_key": API_KEY}))
    assert API_KEY not in repr(config) and API_KEY not in str(config)
    assert API_KEY not in config.model_dump_json()


# --- one rehearsal, watched and then scanned --------------------------------------------------


@dataclass
class Watched:
    work: Path
    code: int
    printed: str
    cmdline_hits: list[str] = field(default_factory=list)
    servers_seen: set[int] = field(default_factory=set)
    listen_addrs: set[str] = field(default_factory=set)
    unauthorized: dict[int, int] = field(default_factory=dict)
    environ_with_key: int = 0
    samples: int = 0


def _marked_prompts(path: Path) -> None:
    """The bundled sample set, with the marker planted in three prompts."""
    lines = bundled("sample_prompts.jsonl").read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        row = json.loads(line)
        if i in (0, 7, 100):
            row["messages"][-1]["content"] += f" (reference {MARKER})"
        out.append(json.dumps(row))
    path.write_text("\n".join(out) + "\n")


def _ask_without_key(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return -1  # gone or not up yet: ask again at the next sample


def _sample(root: psutil.Process, seen: Watched) -> None:
    seen.samples += 1
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        for what, needle in NEEDLES.items():
            if needle in cmdline:
                seen.cmdline_hits.append(f"{what} in pid {proc.info['pid']}: {cmdline[:80]}")
    try:
        children = root.children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            if "regen.emulator" not in " ".join(child.cmdline()):
                continue
            seen.servers_seen.add(child.pid)
            if API_KEY in "".join(child.environ().values()):
                seen.environ_with_key += 1
            for conn in child.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    seen.listen_addrs.add(conn.laddr.ip)
                    if seen.unauthorized.get(conn.laddr.port, -1) == -1:
                        seen.unauthorized[conn.laddr.port] = _ask_without_key(conn.laddr.port)
        except psutil.Error:
            continue


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory, prefect_home: Path) -> Watched:
    work = tmp_path_factory.mktemp("security-run")
    logs = tmp_path_factory.mktemp("security-printed")
    _marked_prompts(work / "prompts.jsonl")
    config = write_yaml(work / "secret.yaml", {"engine": {"api_key": API_KEY, "gpus": [0, 1]}})
    env = regen_env(prefect_home)
    env.update(
        AWS_ACCESS_KEY_ID="AKIAREGENTESTEXAMPLE",
        AWS_SECRET_ACCESS_KEY=AWS_SECRET,
        AWS_SESSION_TOKEN=AWS_SESSION,
    )
    args = ["rehearse", "--config", str(config), "--prompts", "prompts.jsonl", "--out", "out"]
    with (logs / "stdout").open("w") as out, (logs / "stderr").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args], cwd=work, env=env, stdout=out, stderr=err
        )
        seen = Watched(work=work, code=0, printed="")
        root = psutil.Process(proc.pid)
        deadline = time.monotonic() + 360
        while proc.poll() is None and time.monotonic() < deadline:
            _sample(root, seen)
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        seen.code = proc.wait()
    seen.printed = (logs / "stdout").read_text() + (logs / "stderr").read_text()
    return seen


def test_rehearsal_ran(watched: Watched) -> None:
    assert watched.code == 0, watched.printed[-3000:]
    assert watched.servers_seen, f"no emulator seen in {watched.samples} samples"


def test_no_secret_on_any_command_line(watched: Watched) -> None:
    assert watched.servers_seen, "sampling saw no server: the check would be vacuous"
    assert watched.cmdline_hits == []
    # Reported, not asserted: the servers inherit the AWS variables; the key is in a file.
    print(
        f"servers seen {len(watched.servers_seen)}, with the key in environ: "
        f"{watched.environ_with_key}, samples {watched.samples}"
    )


def test_servers_listen_on_loopback_and_refuse_without_the_key(watched: Watched) -> None:
    assert watched.listen_addrs == {"127.0.0.1"}
    answered = {port: code for port, code in watched.unauthorized.items() if code != -1}
    assert answered, watched.unauthorized
    assert set(answered.values()) == {401}, answered


def _scannable(work: Path) -> list[Path]:
    """Every file the run wrote that must hold neither a secret nor prompt text."""
    skip_dirs = (work / ".regen" / "stage", work / "out" / "superseded")
    by_design = {work / "prompts.jsonl", work / "secret.yaml"}
    found = []
    for path in sorted(work.rglob("*")):
        if not path.is_file() or path in by_design:
            continue
        if any(d in path.parents for d in skip_dirs):
            continue
        if path.suffix == ".parquet" and path.parent.name in ("shards", "prompts", "canary"):
            continue
        found.append(path)
    return found


def _text(path: Path) -> str:
    """Parquet pages are compressed: read the values; anything else is scanned as bytes."""
    if path.suffix == ".parquet":
        frame = pl.read_parquet(path)
        return "\n".join(str(v) for col in frame.columns for v in frame[col].to_list())
    return path.read_bytes().decode("latin-1")


def test_no_secret_or_prompt_text_in_files_or_output(watched: Watched, prefect_home: Path) -> None:
    files = _scannable(watched.work)
    names = {p.relative_to(watched.work).as_posix() for p in files}
    for expected in (
        "out/run.json",
        "out/progress.json",
        "out/report/audit.md",
        "out/report/audit.json",
        "out/report/fleet.json",
        "out/rejects/rejects.parquet",
        "out/plan.parquet",
    ):
        assert expected in names, (expected, sorted(names))
    assert any(re.match(r"\.regen/runs/[^/]+/logs/server-", n) for n in names), sorted(names)
    needles = {**NEEDLES, "prompt marker": MARKER}
    logs = set(watched.work.glob(".regen/runs/*/logs"))
    hits = [
        f"{what} in {path.relative_to(watched.work)}"
        for path in files
        for what, needle in needles.items()
        # The servers' own logs hold the key by design (0.5.23 logs its resolved arguments):
        # they stay 0600 in the run's logs/, and the key must be in no other file.
        if needle in _text(path) and not (what == "api key" and path.parent in logs)
    ]
    hits += [f"{what} in stdout/stderr" for what, n in needles.items() if n in watched.printed]
    # Prefect's database holds the flow's parameters (the config), logs and artifacts.
    for path in sorted(prefect_home.rglob("*")):
        if path.is_file():
            data = path.read_bytes().decode("latin-1")
            hits += [f"{w} in prefect home {path.name}" for w, n in needles.items() if n in data]
    assert hits == [], hits
    print(f"scanned {len(files)} files, stdout/stderr and Prefect's home: 0 hits")


def test_the_key_is_in_the_private_server_logs_only(watched: Watched) -> None:
    """The scan above must be able to fail: the emulator logs its arguments as sglang 0.5.23
    does, key included, so the key is there to be found, in 0600 files in the run's logs/."""
    logs = sorted(watched.work.glob(".regen/runs/*/logs/server-*.log"))
    assert logs
    for log in logs:
        assert f"'api_key': '{API_KEY}'" in log.read_text(), log.name
        assert log.stat().st_mode & 0o077 == 0, (log.name, stat.filemode(log.stat().st_mode))


def test_the_marker_is_where_it_belongs(watched: Watched) -> None:
    """The scan must be able to fail: the marker is in the dataset, so it would be found."""
    data = read_committed(LocalStorage(watched.work / "out")).collect()
    planted = data.filter(
        pl.col("messages").list.last().struct.field("content").str.contains(MARKER)
    )
    assert planted.height == 3


def test_nothing_written_is_world_writable(watched: Watched) -> None:
    loose = []
    for path in [*watched.work.rglob("*"), watched.work / "out"]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & stat.S_IWOTH:
            loose.append(f"{path.relative_to(watched.work)} {stat.filemode(mode)}")
    assert loose == []
    [run] = watched.work.glob(".regen/runs/*")
    for private in ("logs", "secrets", "pids"):
        mode = (run / private).stat().st_mode
        assert mode & 0o077 == 0, (private, stat.filemode(mode))
    assert list((run / "secrets").iterdir()) == [], "a key file was left"


def test_repo_holds_no_key_or_secret_literal() -> None:
    """No credential-shaped literal in the shipped code (the test's own fakes live in tests/)."""
    shapes = re.compile(r"AKIA[0-9A-Z]{16}|hf_[A-Za-z0-9]{30,}|-----BEGIN [A-Z ]*PRIVATE KEY")
    hits = []
    for package in ("regen", "flows", "tasks", "blocks"):
        for path in (REPO / package).rglob("*.py"):
            hits += [f"{path.relative_to(REPO)}: {m}" for m in shapes.findall(path.read_text())]
    assert hits == [], hits
