"""The live quality gate in the real flow: a bad run stops after its canary or its first shards,
an outlier server is quarantined while the run goes on, and a stopped run is not rerun blindly.

Each test runs `regenerate_completions` on emulators (the rehearsal's engine) and counts what
reached the servers from the emulators' own logs (`Served N requests` at shutdown).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.concurrency import TunerSettings
from regen.config import RegenConfig
from regen.dataset import read_committed
from regen.display.naming import dataset_slug
from regen.fleet.report import read_fleet_report
from regen.generation.loop import shards_in_flight
from regen.machine.ports import port_is_free
from regen.rehearsal import rehearsal_config
from regen.storage import LocalStorage

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("prefect_harness")]

_SERVED = re.compile(r"Shutting down\. Served (\d+) requests\.")
# The launch's own requests: probes and a minimal bench, far below the counts compared.
_BENCH = {"concurrency": 1, "max_tokens": 16, "budget_s": 0.5}


def _prompts(path: Path, count: int) -> Path:
    with path.open("w") as fh:
        for i in range(count):
            message = {"role": "user", "content": f"Question {i}: name a prime above {i}."}
            fh.write(json.dumps({"id": f"q-{i:05d}", "messages": [message]}) + "\n")
    return path


def _config(tmp_path: Path, prompts: int, *, servers: int = 4, **extra: Any) -> RegenConfig:
    engine = {"bench": _BENCH, "emulator": extra.pop("emulator", {})}
    data = {"work_dir": str(tmp_path / "work"), "shard_size": 100, "engine": engine, **extra}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    source = _prompts(tmp_path / "prompts.jsonl", prompts)
    return rehearsal_config(
        config_path=path, prompts=str(source), out=str(tmp_path / "out"), servers=servers
    )


def _served(config: RegenConfig) -> int:
    """Requests the run's emulators answered, from their logs (written as they shut down)."""
    logs = sorted(config.work_dir.glob("runs/*/logs/server-*.log"))
    counts = [_SERVED.findall(p.read_text()) for p in logs]
    assert logs and all(counts), "every server logs its count when it shuts down"
    return sum(int(c[-1]) for c in counts)


def _no_server_left(config: RegenConfig) -> None:
    ports = [config.engine.base_port + i for i in range(len(config.engine.gpus))]
    assert all(port_is_free("127.0.0.1", p) for p in ports), "a server outlived the run"


def _stop_record(config: RegenConfig) -> dict[str, Any]:
    return json.loads((Path(config.output) / "report" / "stopped.json").read_text())


def _latest_artifacts(state: Any) -> dict[str, Any]:
    """The flow run's artifacts by key, each at its latest version."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    latest: dict[str, Any] = {}
    for a in sorted(found, key=lambda a: str(a.created)):
        if a.key:
            latest[a.key] = a
    return latest


def test_the_incident_stops_at_the_canary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.regenerate import regenerate_completions

    config = _config(tmp_path, 5000, emulator={"faults": ["empty-answer=0.87"]})
    state = regenerate_completions(config, return_state=True)

    assert state.is_failed() and not state.is_crashed(), state
    message = state.message or ""
    # One wording for every gate: FAIL, the gate, the failing checks with their figures.
    assert message.startswith("FAIL: canary gate stopped the run after 256 rows: "), message
    figure = re.search(r"empty_answer (\d+(?:\.\d+)?) % \(fail at", message)
    assert figure and float(figure.group(1)) == pytest.approx(87, abs=6), message
    served = _served(config)
    _no_server_left(config)
    storage = LocalStorage(Path(config.output))
    assert read_committed(storage).shards == [], "nothing is committed past a failed canary"
    record = _stop_record(config)
    # The canary and the shard rows sent behind it while it was judged, none committed: what
    # the fleet's slots took until the verdict, at most the shards in flight, whatever the
    # run's size.
    # Each server's concurrency is tuned up to its cap, so the shards in flight are the caps'.
    caps = [r.max_running_requests or 0 for r in read_fleet_report(storage) or []]
    ceiling = TunerSettings().max_concurrency
    slots = sum(min(ceiling, cap or ceiling) for cap in caps)
    window = shards_in_flight(slots, config.shard_size) * config.shard_size
    # (Sent, not served: a request in flight when the gate stops is cancelled unanswered.)
    assert record["stage"] == "canary" and record["prompts_sent"] >= 256, record
    assert served >= 256, "the servers answered the whole canary"
    assert record["prompts_sent"] <= 256 + window, record["prompts_sent"]
    assert record["prompts_sent"] < 5000, "a stop at the canary sent the whole run"
    assert {c["check"] for c in record["checks"]} >= {"empty_answer", "answer_collapse"}
    assert storage.exists(record["canary"]), "the canary's rows are kept for inspection"
    report = (Path(config.output) / "report" / "audit.md").read_text()
    assert "**FAIL: canary gate stopped the run after 256 rows" in report
    assert "(stopped by the canary gate) empty/trivial answers" in report
    audit = json.loads((Path(config.output) / "report" / "audit.json").read_text())
    assert audit["stopped"].startswith("canary gate stopped the run")
    assert audit["verdict"] == "fail" and audit["gate"] == "canary"
    # Judged on what it generated: the canary's rows, every check computed over them.
    assert audit["rows"] == audit["uncommitted"] == 256
    checks = {c["name"]: c for c in audit["checks"]}
    assert checks["empty_answer"]["status"] == "fail"
    assert checks["empty_answer"]["figure"] == pytest.approx(0.87, abs=0.06)
    loss = checks["loss_mask"]
    assert loss["status"] == "fail" and loss["figure"] == pytest.approx(0.87, abs=0.06)
    assert "from stored token ids: 256, from the chat template: 0" in loss["detail"], loss
    assert {e["reason"] for e in loss["examples"]} == {"6 loss tokens"}
    # The live artifacts are left saying how the run ended, not that it is under way.
    found, slug = _latest_artifacts(state), dataset_slug(config.output)
    live = str(found[f"fleet-live-{slug}"].data)
    assert "stopped: canary gate stopped the run after 256 rows" in live, live
    assert "no shard committed yet" not in live and "ETA" not in live, live
    progress = found[f"generation-progress-{slug}"]
    # Generated and committed named apart; the bar shows what the dataset holds: nothing.
    said = progress.description or ""
    assert said.startswith("stopped · 0 / 5,000 committed ("), said
    assert "generated) · canary gate stopped the run after 256 rows" in said, said
    assert progress.data == 0, progress.data
    assert "rows generated (" in live and ", 0 committed" in live, live
    dataset = str(found[f"dataset-{slug}"].data)
    assert "report/stopped.json" in dataset and "/canary/" in dataset, dataset
    assert "to generate" not in dataset and "0 rows committed of 5,000 planned" in dataset
    written = json.loads((Path(config.output) / "progress.json").read_text())
    assert written["ended"].startswith("stopped: canary gate") and written["eta_s"] is None
    history = json.loads(str(found[f"throughput-{slug}"].data))
    assert history and {"time (UTC)", "output tok/s", "server-0 tok/s"} <= set(history[-1])

    # `regen audit` on the stopped dataset names the gate that stopped it, as the run did.
    from flows.cli import main

    capsys.readouterr()
    assert main(["audit", config.output]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert ": FAIL (stopped by the canary gate) empty/trivial answers" in said, said
    assert "stopped: canary gate stopped the run after 256 rows: empty_answer" in said, said

    # Rerun unchanged: refused before anything is launched, naming why the last run stopped.
    again = regenerate_completions(config, return_state=True)
    assert again.is_failed()
    assert "the last run stopped at the canary" in (again.message or ""), again.message
    assert "generation.new_output: true" in (again.message or "")


def test_a_fault_that_starts_late_is_caught_by_the_rolling_audit(tmp_path: Path) -> None:
    from flows.regenerate import regenerate_completions

    # Each server turns bad after 150 chats: the canary (64 per server) passes, shards do not.
    config = _config(
        tmp_path,
        4000,
        emulator={"faults": ["empty-answer=0.87", "faults-after=150"]},
        audit={"live_min_rows": 500},
    )
    state = regenerate_completions(config, return_state=True)

    assert state.is_failed() and not state.is_crashed(), state
    assert (state.message or "").startswith("FAIL: rolling gate stopped the run"), state.message
    record = _stop_record(config)
    assert record["stage"] == "rolling"
    committed = read_committed(LocalStorage(Path(config.output)))
    # Bounded: the stop lands within the shards in flight after the threshold is crossed.
    assert 5 <= len(committed.shards) <= 25, committed.shards
    assert _served(config) < 0.75 * 4000
    _no_server_left(config)
    progress = json.loads((Path(config.output) / "progress.json").read_text())
    assert progress["audit"]["checks"]["empty_answer"]["status"] == "fail"


def test_an_outlier_server_is_quarantined_and_the_run_completes(tmp_path: Path) -> None:
    from flows.regenerate import regenerate_completions

    config = _config(tmp_path, 1200, emulator={"server_faults": {0: ["empty-answer=1.0"]}})
    state = regenerate_completions(config, return_state=True)

    assert state.is_completed(), state.message
    audit = json.loads((Path(config.output) / "report" / "audit.json").read_text())
    assert audit["verdict"] in ("pass", "warn") and audit["stopped"] is None
    rows = read_committed(LocalStorage(Path(config.output))).collect()
    assert rows.height == 1200 and rows["id"].n_unique() == 1200
    assert "server-0" not in set(rows["server"].to_list()), "its canary rows were not committed"
    progress = json.loads((Path(config.output) / "progress.json").read_text())
    assert progress["audit"]["quarantined"] == ["server-0"]
    _no_server_left(config)
