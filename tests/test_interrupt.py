"""Ctrl-C as a terminal sends it: SIGINT to the whole process group of `regen rehearse`.

The group holds the run and, with ephemeral Prefect (a user's rehearsal), Prefect's temporary
API server. Before, the server died with the first SIGINT and the run hung on the dead API
(`Crash detected!`, `Error logging to API`, alive after 120 s). Every trial here signals the
group at one stage and wants: the signal's exit code within seconds, the one resume line,
no traceback, no server, no PID file and no process of the run left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from regen.machine.interrupt import Interrupts, exit_code, resume_line
from regen.rehearsal import bundled
from support.chaos import (
    ChaosRun,
    ProcessMark,
    descendants,
    kill_leftovers,
    leftovers,
    server_records,
    start_rehearsal,
    wait_until,
    write_chaos_config,
    write_prompt_subset,
)

PROMPTS = 120  # 6 shards of 20


class Rehearsal:
    """One `regen rehearse` in its own session (pgid == pid), as a terminal's foreground job."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        work = tmp_path / "work"
        prompts = write_prompt_subset(
            bundled("sample_prompts.jsonl"), tmp_path / "p.jsonl", PROMPTS
        )
        self.run = ChaosRun(
            config=write_chaos_config(tmp_path / "regen.yaml", work),
            out=str(tmp_path / "out"),
            work_dir=work,
            prompts=prompts,
        )
        self.log = tmp_path / "run.log"
        self.proc = start_rehearsal(self.run, env, tmp_path, self.log)
        self.seen: dict[tuple[int, float], ProcessMark] = {}

    @property
    def out(self) -> Path:
        return Path(self.run.out)

    def manifests(self) -> int:
        shards = self.out / "shards"
        return len(list(shards.glob("shard-*.json"))) if shards.is_dir() else 0

    def wait(self, ready: Callable[[], bool]) -> None:
        def noting() -> bool:
            self.seen.update({(m.pid, m.started): m for m in descendants(self.proc.pid)})
            return ready()

        reached = wait_until(noting, self.proc, timeout_s=240, poll_s=0.05)
        assert reached and self.proc.poll() is None, f"stage not reached:\n{self.output()}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def rehearsals() -> Iterator[list[Rehearsal]]:
    started: list[Rehearsal] = []
    yield started
    for r in started:
        if r.proc.poll() is None:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
        kill_leftovers(list(r.seen.values()))


STAGES: dict[str, Callable[[Rehearsal], bool]] = {
    # run.json is written by the plan, before staging and the fleet.
    "plan": lambda r: (r.out / "run.json").is_file() and not server_records(r.run.work_dir),
    "fleet": lambda r: bool(server_records(r.run.work_dir)) and r.manifests() == 0,
    "generation": lambda r: bool(server_records(r.run.work_dir)) and r.manifests() >= 2,
    # Every shard committed: the fleet goes down and the audit runs.
    "audit": lambda r: r.manifests() >= PROMPTS // 20,
}


def _signal_group_and_check(r: Rehearsal, sig: signal.Signals, within_s: float) -> float:
    processes = list(r.seen.values()) + descendants(r.proc.pid)
    servers = server_records(r.run.work_dir)
    sent = time.monotonic()
    os.killpg(r.proc.pid, sig)  # the whole group, as a terminal does
    try:
        rc = r.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{sig.name} to the group: still running 60 s later:\n{r.output()[-4000:]}")
    took = time.monotonic() - sent
    out = r.output()
    if rc == 0 and "audit:" in out:
        pytest.skip("the run ended before the signal landed")
    assert rc == exit_code(sig), f"exit {rc}:\n{out[-4000:]}"
    assert took < within_s, f"took {took:.1f} s to stop"
    lines = [line for line in out.splitlines() if line.startswith("regen: interrupted by")]
    assert lines == [resume_line(sig, r.run.out, r.run.argv()[3:])], lines
    assert "Traceback" not in out and "Error logging to API" not in out, out[-4000:]
    assert leftovers(processes, timeout_s=5) == [], "processes of the run left running"
    assert server_records(r.run.work_dir) == [], f"PID files left: {servers}"
    return took


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", list(STAGES))
def test_ctrl_c_to_the_process_group_stops_the_run_in_seconds(
    stage: str, tmp_path: Path, regen_env: dict[str, str], rehearsals: list[Rehearsal]
) -> None:
    r = Rehearsal(tmp_path, regen_env)
    rehearsals.append(r)
    r.wait(lambda: STAGES[stage](r))
    _signal_group_and_check(r, signal.SIGINT, within_s=15)


@pytest.mark.timeout(300)
def test_sigterm_to_the_process_group_stops_the_run_with_143(
    tmp_path: Path, regen_env: dict[str, str], rehearsals: list[Rehearsal]
) -> None:
    r = Rehearsal(tmp_path, regen_env)
    rehearsals.append(r)
    r.wait(lambda: STAGES["generation"](r))
    _signal_group_and_check(r, signal.SIGTERM, within_s=15)


@pytest.mark.timeout(300)
def test_ctrl_c_with_the_prefect_api_gone_still_stops_within_the_watchdog(
    tmp_path: Path, regen_env: dict[str, str], rehearsals: list[Rehearsal]
) -> None:
    """The API the run reports to died first (killed, out of memory): unwinding waits on it,
    and the watchdog ends the run anyway, fleet stopped."""
    r = Rehearsal(tmp_path, regen_env)
    rehearsals.append(r)
    r.wait(lambda: STAGES["generation"](r))
    prefect = [m for m in descendants(r.proc.pid) if m.kind == "prefect"]
    assert len(prefect) == 1, descendants(r.proc.pid)
    os.kill(prefect[0].pid, signal.SIGKILL)
    servers = server_records(r.run.work_dir)
    processes = list(r.seen.values())
    os.killpg(r.proc.pid, signal.SIGINT)
    sent = time.monotonic()
    rc = r.proc.wait(timeout=60)
    assert rc == 130 and time.monotonic() - sent < 30, r.output()[-4000:]
    assert leftovers(processes, timeout_s=5) == []
    assert servers and server_records(r.run.work_dir) == []


# The watchdog alone, in a child process: a run whose unwinding hangs.
_HANGING = """
import signal, sys, time
from regen.machine.interrupt import Interrupts
stopped = []
interrupts = Interrupts(
    line=lambda sig: f"resume after {sig.name}",
    stop_fleet=lambda: print("fleet stopped", flush=True),
    grace_s=float(sys.argv[1]),
)
with interrupts.installed():
    try:
        # Ready inside the try: a signal sent at once must land where the run catches it.
        print("ready", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("unwinding", flush=True)
        while True:  # an orchestrator call that never returns
            try:
                time.sleep(60)
            except KeyboardInterrupt:
                pass
"""


def _hanging(grace_s: float, **popen: object) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HANGING, str(grace_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,  # type: ignore[call-overload]
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_the_watchdog_ends_a_hung_unwinding_after_its_grace() -> None:
    proc = _hanging(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 130 and time.monotonic() - sent < 10
    assert out.splitlines() == ["unwinding", "fleet stopped", "resume after SIGINT"]


def test_a_second_signal_ends_it_at_once() -> None:
    proc = _hanging(120.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline() == "unwinding\n"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143 and time.monotonic() - sent < 10
    assert out.splitlines() == ["fleet stopped", "resume after SIGTERM"]


def test_an_ignored_sigint_stays_ignored_and_sigterm_stops() -> None:
    """`nohup regen ... &` from a script: the shell ignores SIGINT for background jobs."""
    proc = _hanging(1.0, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    proc.send_signal(signal.SIGINT)
    time.sleep(1.5)
    assert proc.poll() is None, "an ignored SIGINT stopped the run"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 143
    assert out.splitlines()[-1] == "resume after SIGTERM"


def test_handlers_are_put_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with Interrupts(line=str, stop_fleet=lambda: None).installed():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


# A Ctrl-C that lands while Prefect starts a task run is turned by Prefect 3.9.1 into
# `ValueError: Task run is not set` (task_engine.handle_crash before the run exists), and the
# flow ends Failed instead of raising. This stands a real flow in for the run's, its task
# signalling the process and raising what Prefect raises there.
_RACE = """
import os, signal, sys
from prefect import flow, task
import flows.regenerate
from flows.runner import run_regenerate
from regen.config import ModelConfig, RegenConfig

@task
def starting() -> None:
    try:
        os.kill(os.getpid(), signal.SIGINT)
        signal.pause()
    except KeyboardInterrupt:
        raise ValueError("Task run is not set") from None

@flow
def stand_in(config: RegenConfig) -> None:
    starting()

flows.regenerate.regenerate_completions = stand_in
config = RegenConfig(model=ModelConfig(source=sys.argv[1], served_name="m"), prompts=sys.argv[1],
                     output=sys.argv[2], work_dir=sys.argv[3])
sys.exit(run_regenerate(config))
"""


@pytest.mark.timeout(180)
def test_an_interrupt_prefect_turns_into_another_error_still_ends_as_an_interrupt(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run(
        [sys.executable, "-c", _RACE, str(tmp_path), str(out), str(work)],
        env=regen_env,
        capture_output=True,
        text=True,
        timeout=150,
        start_new_session=True,
    )
    said = done.stdout + done.stderr
    assert done.returncode == exit_code(signal.SIGINT), said[-4000:]
    lines = [line for line in said.splitlines() if line.startswith("regen: interrupted by")]
    assert len(lines) == 1 and str(out) in lines[0], said[-4000:]
    assert "Traceback" not in said and "regen: run failed" not in said, said[-4000:]
