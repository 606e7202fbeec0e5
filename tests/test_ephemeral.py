"""Prefect's temporary server is stopped only once it has recorded the run (issue 44).

A dead fleet once ended 58 shard tasks in one second; the server, one database write per
task-run event, was still behind when Prefect stopped it at exit, and printed four tracebacks
(`Error flushing 1 events`) after the run's last line. `flows.ephemeral.settle` waits until a
task run started after the run's last one is recorded. Here a flow ends 200 task runs at once
in a process of its own with ephemeral Prefect, as `regen run` does: as the flow returns, the
server has recorded a fraction of them (55 of 300 on a loaded 2-core machine).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import REPO

SCRIPT = """
    import sys, threading
    from flows.ephemeral import settle, start_temporary_server
    server = start_temporary_server()
    server.wait_ready()
    from prefect import flow, get_client, task
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.runtime import flow_run
    from prefect.states import Cancelled
    from prefect.task_runners import ThreadPoolTaskRunner

    TASKS = int(sys.argv[1])
    go = threading.Event()

    @task(name="shard")
    def shard(i: int):
        go.wait(60)
        return Cancelled(message=f"shard {i} not committed")

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=TASKS))
    def burst() -> str:
        started = [shard.submit(i) for i in range(TASKS)]
        go.set()  # every task run ends at once, as the shards of a run whose fleet died
        for future in started:
            future.wait()
        return str(flow_run.id)

    run_id = burst()
    settle(server, timeout_s=300)  # a hang guard: a loaded machine records slowly
    final = 0
    with get_client(sync_client=True) as client:
        for offset in range(0, TASKS, 100):  # the API reads at most 200 a call
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
                limit=100, offset=offset,
            )
            final += sum(r.state is not None and r.state.is_final() for r in runs)
    print(f"recorded final: {final} of {TASKS}", flush=True)
"""


@pytest.mark.timeout(400)
def test_the_temporary_server_records_a_burst_of_task_runs_before_it_stops(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    script = tmp_path / "burst.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), "200"],
        cwd=REPO, env={**regen_env, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=360, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    # Without the wait, the server was still writing when the flow returned (fewer final).
    assert "recorded final: 200 of 200" in said, said[-4000:]
    assert "Traceback" not in said and "Error flushing" not in said, said[-6000:]
    assert "regen-settle" not in said, "the settling task run printed its own lines"
