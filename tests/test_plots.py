"""Pictures where people look: the audit's plots linked from audit.md and carried in its
artifact, and throughput over time drawn small enough to redraw at every scrape."""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path

import numpy as np
import pytest

from regen.audit import run_audit, write_report
from regen.audit.report import plot_pngs
from regen.config import AuditConfig
from regen.display.plots import THROUGHPUT_POINTS, downsample, live_plots, throughput_png
from regen.fleet.metrics import ServerFigures
from regen.progress.fleet_live import Interval, LiveReport
from regen.progress.snapshot import ProgressSnapshot
from regen.storage import LocalStorage
from tasks.pictures import embedded
from tests.support.audit import make_dataset

PNG = b"\x89PNG\r\n\x1a\n"
THREE_DAYS = 8640
"""Intervals of a three-day run scraped every 30 s."""


def _history(n: int, servers: int = 8) -> tuple[Interval, ...]:
    rng = np.random.default_rng(0)
    start = time.time() - 30.0 * n
    return tuple(
        Interval(
            start + 30.0 * i,
            10 * i,
            56_000 + float(rng.normal(0, 2000)),
            # server-3's /metrics missing now and then: a gap, not a zero
            tuple(
                None if k == 3 and i % 7 == 0 else 7000 + float(rng.normal(0, 300))
                for k in range(servers)
            ),
        )
        for i in range(n)
    )


def test_the_throughput_chart_of_a_three_day_run_is_a_small_png() -> None:
    names = [f"server-{k}" for k in range(8)]
    chart = throughput_png(_history(THREE_DAYS), names)
    assert chart is not None and chart[:8] == PNG
    size = len(chart)
    print(f"\nthroughput chart, 8 servers, {THREE_DAYS:,} intervals: {size:,} B PNG")
    # Redrawn into Prefect's database every scrape: a few tens of KB at most, whatever the
    # run's length (the points are downsampled).
    assert size < 40_000, size
    short = throughput_png(_history(40), names)
    assert short is not None and abs(len(short) - size) < 20_000


def test_one_scrape_is_no_line() -> None:
    assert throughput_png(_history(1), ["server-0"]) is None
    assert throughput_png((), ["server-0"]) is None


def test_downsampling_keeps_means_and_gaps() -> None:
    values = np.arange(THREE_DAYS, dtype=float)
    down = downsample(values, THROUGHPUT_POINTS)
    assert len(down) == THROUGHPUT_POINTS
    assert down[0] == pytest.approx(np.arange(72).mean())  # 8,640 / 120 = 72 a span
    rates = np.array([[1.0, np.nan], [3.0, np.nan], [5.0, 2.0], [7.0, np.nan]])
    two = downsample(rates, 2)
    assert two[0, 0] == 2.0 and np.isnan(two[0, 1]), "a server silent for a span is a gap"
    assert two[1, 1] == 2.0, "a missing scrape is left out of the mean, not a zero"
    assert downsample(values[:5], THROUGHPUT_POINTS) is not None


def test_the_live_report_carries_its_chart_as_a_data_uri() -> None:
    progress = ProgressSnapshot(
        updated_at=0, elapsed_s=1, total=10, done=5, already_done=0, ok=5, failed=0,
        in_flight=0, queued=0, retries=0, shards_committed=1, rows_committed=5,
        output_tokens=64, tokens_per_s=64.0, rows_per_s=5.0, eta_s=1.0, servers=(),
    )  # fmt: skip
    servers = tuple(ServerFigures(f"server-{k}", "http://x", None, None) for k in range(2))
    report = LiveReport(time.time(), progress, servers, _history(100, servers=2))
    section = embedded(live_plots(report))
    found = re.fullmatch(r"## Plots\n\n!\[throughput\]\(data:image/png;base64,([^)]+)\)\n", section)
    assert found, section[:200]
    assert base64.b64decode(found[1])[:8] == PNG
    assert embedded(live_plots(LiveReport(time.time(), progress, servers))) == ""


def test_audit_md_links_its_plots_and_the_artifact_carries_them(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", defects={"empty": 0.1})
    result = run_audit(ds.storage, AuditConfig())
    plots = plot_pngs(result)
    assert set(plots) == {"lengths", "finish_reasons", "servers"}
    out = LocalStorage(tmp_path / "report-root")
    write_report(out, result, plots)
    markdown = (tmp_path / "report-root/report/audit.md").read_text()
    # audit.md sits in report/ beside the PNGs: each is shown by a relative link.
    for name in plots:
        assert f"![{name}]({name}.png)" in markdown
        assert (tmp_path / f"report-root/report/{name}.png").read_bytes() == plots[name]
    carried = embedded(plots)
    uris = re.findall(r"!\[(\w+)\]\(data:image/png;base64,([^)]+)\)", carried)
    assert {name for name, _ in uris} == set(plots)
    assert all(base64.b64decode(data) == plots[name] for name, data in uris)
    print(f"\naudit plots: {', '.join(f'{n} {len(b):,} B' for n, b in plots.items())}; "
          f"the artifact's plots section {len(carried):,} characters")  # fmt: skip
    # Bounded: one artifact a run, in Prefect's database.
    assert len(carried) < 200_000
