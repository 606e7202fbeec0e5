"""Live fleet figures: each server's own /metrics, scraped while a run generates."""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.display.naming import artifact_key
from regen.fleet.metrics import FleetScraper, ServerFigures
from regen.progress.fleet_live import Interval, LiveReport
from regen.progress.snapshot import ProgressSnapshot
from regen.rehearsal import rehearsal_config
from regen.sglang_api.endpoint import Endpoint
from support.emulator import emulators as launch_emulators
from tests.support.fleet import SERVED


@pytest.fixture
def emulators(tmp_path: Path) -> Iterator[list[str]]:
    """Two real emulators: one exporting metrics with accept length 2.5, one without metrics."""
    common = ["--emu-load-s", "0", "--emu-time-scale", "0.01", "--speculative-algorithm", "NEXTN"]
    flags = [
        [*common, "--enable-metrics", "--emu-accept-length", "2.5"],
        [*common, "--emu-accept-length", "3.1"],
    ]
    with launch_emulators(tmp_path, flags, served_name=SERVED, timeout=30) as fleet:
        yield [emu.url for emu in fleet]


def _chat(url: str) -> None:
    body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=30).close()


def test_each_server_figures_come_from_its_own_metrics(emulators: list[str]) -> None:
    scraper = FleetScraper([Endpoint(i, url) for i, url in enumerate(emulators)])
    scraper.scrape()
    _chat(emulators[0])
    with_metrics, without = scraper.scrape()
    assert with_metrics.metrics is not None and without.metrics is None
    assert with_metrics.metrics.accept_length == 2.5
    assert with_metrics.metrics.generation_tokens and with_metrics.tokens_per_s
    progress = ProgressSnapshot(
        updated_at=0, elapsed_s=1, total=10, done=5, already_done=0, ok=5, failed=0,
        in_flight=0, queued=0, retries=0, shards_committed=1, rows_committed=5,
        output_tokens=64, tokens_per_s=64.0, rows_per_s=5.0, eta_s=1.0, servers=(),
    )  # fmt: skip
    report = LiveReport(time.time(), progress, (with_metrics, without))
    markdown = report.to_markdown()
    assert re.search(r"\| server-0 \| [\d.,]+ \| 0 \| 0 \| [\d.]+ % \| 2.50 \|", markdown), markdown
    assert "| server-1 | **metrics missing** |" in markdown
    assert f"- server-1: `{emulators[1]}/metrics`" in markdown
    assert "server-1 metrics missing" in report.log_line()


def test_an_idle_server_shows_zero_tokens_per_second(emulators: list[str]) -> None:
    """The rate is over the last interval from the server's counter: an idle server shows 0,
    not its throughput gauge's last value (idle servers once showed 250 tok/s each while the
    headline said 0)."""
    endpoints = [Endpoint(0, emulators[0])]
    _chat(emulators[0])
    fresh = FleetScraper(endpoints).scrape()[0]
    assert fresh.metrics is not None and fresh.metrics.gen_throughput, "the gauge keeps a value"
    assert fresh.tokens_per_s == 0.0, "no baseline and nothing running: idle"
    scraper = FleetScraper(endpoints)
    scraper.prime()
    _chat(emulators[0])
    busy = scraper.scrape()[0]
    assert busy.tokens_per_s and busy.tokens_per_s > 0
    time.sleep(0.05)
    idle = scraper.scrape()[0]
    assert idle.tokens_per_s == 0.0, idle


def test_throughput_history_keeps_every_interval_or_their_means() -> None:
    progress = ProgressSnapshot(
        updated_at=0, elapsed_s=1, total=10, done=5, already_done=0, ok=5, failed=0,
        in_flight=0, queued=0, retries=0, shards_committed=1, rows_committed=5,
        output_tokens=64, tokens_per_s=64.0, rows_per_s=5.0, eta_s=1.0, servers=(),
    )  # fmt: skip
    server = ServerFigures("server-0", "http://x", None, None)
    # Three days scraped every 30 s: 8,640 intervals, the rate climbing by 1 each.
    history = tuple(Interval(30.0 * i, i, float(i), (float(i),)) for i in range(8640))
    report = LiveReport(time.time(), progress, (server,), history)
    table = report.history_table()
    assert len(table) == 240 and table[0]["output tok/s"] == "17.5"  # mean of 0..35
    assert table[-1]["rows done"] == "8,639" and table[-1]["server-0 tok/s"] == "8,620"
    assert len(LiveReport(time.time(), progress, (server,), history[:5]).history_table()) == 5


# | server | tok/s | running | queued | KV cache | accept length |
ROW = re.compile(
    r"^\| (server-\d) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", re.M
)


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("prefect_harness")
def test_live_artifact_is_updated_while_a_slowed_rehearsal_runs(tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.regenerate import regenerate_completions

    # ~10 s of generation: 240 prompts, 8 in flight of ~0.3 s each; a scrape every second.
    settings = {
        "work_dir": str(tmp_path / "work"),
        "shard_size": 60,
        "concurrency_per_server": 4,
        "generation": {"live_interval_s": 1.0},
        "engine": {
            "emulator": {
                "time_scale": 0.5,
                "reasoning_tokens": "100:200",
                "answer_tokens": "20:50",
                "accept_length": 2.5,  # only each server's /metrics knows it
            },
            "bench": {"concurrency": 2, "max_tokens": 16, "budget_s": 5},
        },
    }
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(settings))
    config = rehearsal_config(
        config_path=tmp_path / "slow.yaml", out=str(tmp_path / "out"), servers=2
    )
    result: dict[str, Any] = {}
    run = threading.Thread(
        target=lambda: result.update(state=regenerate_completions(config, return_state=True))
    )
    run.start()
    key = artifact_key("fleet-live", config.output)
    seen: list[str] = []
    with get_client(sync_client=True) as client:
        while run.is_alive():
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
            )
            data = str(found[0].data) if found else ""
            if ROW.search(data) and (not seen or data != seen[-1]):
                seen.append(data)
            time.sleep(0.2)
    run.join()
    print(f"\n{len(seen)} live updates seen while the run was going")
    assert result["state"].is_completed(), result["state"].message
    assert len(seen) >= 3, seen
    for data in seen:
        rows = {m[1]: m.groups() for m in ROW.finditer(data)}
        assert set(rows) == {"server-0", "server-1"}, data
        assert all(row[5].strip() == "2.50" for row in rows.values()), data
    running = [float(m[3]) for data in seen for m in ROW.finditer(data)]
    assert any(r > 0 for r in running), "no update saw a request running"
    # Throughput over the run drawn in, small enough to redraw at every scrape (regen.display).
    chart = re.search(r"!\[throughput\]\(data:image/png;base64,([^)]+)\)", seen[-1])
    assert chart, seen[-1][-300:]
    png = base64.b64decode(chart[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 40_000, len(png)
    print(f"fleet-live artifact: {len(seen[-1]):,} characters, its chart {len(png):,} B PNG")


def test_accept_length_is_missing_with_speculative_decoding_off(tmp_path: Path) -> None:
    """0.5.23 exports `sglang:spec_accept_length 0.0` without speculative decoding (the real
    server on a CPU showed it, and the emulator answers so): the live line says nothing,
    not `accept 0`, as fleet.json does."""
    flags = [["--emu-load-s", "0", "--enable-metrics"]]
    with launch_emulators(tmp_path, flags, served_name=SERVED, timeout=30) as fleet:
        url = fleet[0].url
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        assert re.search(r"^sglang:spec_accept_length\{.*\} 0\.0$", text, re.M)
        _chat(url)
        [figures] = FleetScraper([Endpoint(0, url)]).scrape()
    assert figures.metrics is not None and figures.metrics.running is not None
    assert figures.metrics.accept_length is None
