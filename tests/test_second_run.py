"""Two `regen rehearse` into one output, from separate work dirs (two tmux panes): the second is
refused before it stages or launches anything, in one line naming the first; the first goes
on untouched. Before, the second regenerated every shard and then failed on commits
(`shard 9 is already committed; use replace_shard`): a whole run's compute thrown away.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.rehearsal import bundled
from regen.storage import LocalStorage
from support.chaos import (
    ChaosRun,
    descendants,
    kill_leftovers,
    start_rehearsal,
    wait_until,
    write_chaos_config,
    write_prompt_subset,
)
from support.dataset import dataset_ids
from support.prefect import Server, prefect_server

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def prefect(prefect_server_home: Path) -> Iterator[Server]:
    with prefect_server(prefect_server_home, startup_timeout=240) as server:
        yield server


def test_a_second_run_on_a_held_output_is_refused_before_it_costs_anything(
    tmp_path: Path, prefect: Server
) -> None:
    env = {**prefect.env, "PYTHONUNBUFFERED": "1"}
    prompts = write_prompt_subset(bundled("sample_prompts.jsonl"), tmp_path / "p.jsonl", 120)
    out = str(tmp_path / "out")
    runs = []
    # The first run's emulators at a GPU's pace: it is still generating when the second one
    # (a process that takes seconds to start on a loaded machine) reaches its plan.
    for name, time_scale in (("first", 1.0), ("second", 0.4)):
        work = tmp_path / name
        work.mkdir()
        config = write_chaos_config(work / "regen.yaml", work / "work", time_scale=time_scale)
        runs.append(ChaosRun(config=config, out=out, work_dir=work / "work", prompts=prompts))
    first = start_rehearsal(runs[0], env, tmp_path, tmp_path / "first.log")
    started = [first]
    try:
        # The first run generates: it has committed a shard and has more to go.
        shards = tmp_path / "out" / "shards"
        generating = wait_until(lambda: bool(list(shards.glob("shard-*.json"))), first, 240)
        assert generating, (tmp_path / "first.log").read_text()
        second = start_rehearsal(runs[1], env, tmp_path, tmp_path / "second.log")
        started.append(second)
        t0 = time.monotonic()
        rc = second.wait(timeout=120)
        took = time.monotonic() - t0
        said = (tmp_path / "second.log").read_text()
        assert first.poll() is None, "the first run ended before the second was judged"
        assert rc == 1, said
        assert f"output held by another run: pid {first.pid} on " in said, said
        assert "flow run " in said and "Traceback" not in said
        # It staged nothing and launched nothing: no server, no PID file, no stage dir.
        assert not (runs[1].work_dir / "pids").exists() or not list(
            (runs[1].work_dir / "pids").iterdir()
        )
        assert not (runs[1].work_dir / "stage").exists()
        print(f"second run refused in {took:.1f} s")
        # The first run goes on untouched: it commits, and stops on a terminal's Ctrl-C as any
        # run does, its shards whole (finishing it would take minutes at a GPU's pace).
        more = len(list(shards.glob("shard-*.json"))) + 1
        assert wait_until(lambda: len(list(shards.glob("shard-*.json"))) >= more, first, 240)
        os.killpg(first.pid, signal.SIGINT)
        assert first.wait(timeout=120) == 130, (tmp_path / "first.log").read_text()[-3000:]
        ids = dataset_ids(LocalStorage(tmp_path / "out"))
        assert ids.doubled() == [] and ids.ids, ids
        assert "already committed" not in (tmp_path / "first.log").read_text()
    finally:
        for proc in started:
            if proc.poll() is None:
                kill_leftovers(descendants(proc.pid))
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
