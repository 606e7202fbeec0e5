"""Read at a glance (issue 38): every card leads with its figure, one set of numbers, names that
tell runs and datasets apart, reasons where a row failed. The figures here are built from the
real progress meter, audit model and CLI parser; tests/test_flow.py reads them back from a
real Prefect run."""

from __future__ import annotations

import calendar
import re
import shlex
import time
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from regen.audit.result import AuditResult, Quantiles
from regen.client.stats import DispatchStats, ServerStats
from regen.config import RegenConfig
from regen.display.figures import byte_size, clock, compact, count, eta, sig
from regen.display.naming import artifact, dataset_markdown, run_name, run_tags
from regen.display.progress import progress_card, progress_headline, progress_markdown, rows_line
from regen.fleet.metrics import ServerFigures, ServerMetrics
from regen.progress.fleet_live import LiveReport
from regen.progress.meter import ProgressMeter
from regen.progress.snapshot import ProgressSnapshot
from regen.rehearsal import rehearsal_config

# 2026-12-07 00:54:36 UTC: 24 s before 00:55.
AT = calendar.timegm((2026, 12, 7, 0, 54, 36, 0, 0, 0))
CARD_CUT = 56
"""Characters a Prefect 3.9.1 card shows of a description (~50), with the issue's example."""


def _stats(at: float, ok: int, tokens: tuple[int, ...]) -> DispatchStats:
    servers = tuple(
        ServerStats(f"server-{i}", f"http://s{i}", "healthy", 2, 8, 0, 0, t, 0)  # type: ignore[arg-type]
        for i, t in enumerate(tokens)
    )
    return DispatchStats(at, ok, 0, 4, ok, 0, 0, sum(tokens), 60.0, servers)


def _snapshot(**changes: object) -> ProgressSnapshot:
    base = ProgressSnapshot(
        updated_at=AT, elapsed_s=100.0, total=6000, done=4920, already_done=0, ok=4920,
        failed=0, in_flight=8, queued=0, retries=0, shards_committed=9, rows_committed=4500,
        output_tokens=6_430_000, tokens_per_s=64_321.0, rows_per_s=45.0, eta_s=24.0, servers=(),
        audit={"rows": 4500, "checks": {"empty_answer": {"figure": 0.01, "status": "pass"}}},
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_figures_for_cards_and_bounds() -> None:
    assert count(4096) == "4,096" and count(4096.0) == "4,096" and count(None) == "–"
    assert sig(4096) == "4,100", "sig rounds; counts must not"
    assert compact(64_321) == "64.3k" and compact(1_234_567) == "1.23M" and compact(812) == "812"
    assert clock(AT + 24, now=AT) == "00:55 UTC"
    assert clock(AT + 41.3 * 3600, now=AT) == "Dec 08 18:12 UTC", "another day names its date"
    assert eta(AT, 24.0) == "ETA 00:55 UTC (24 s)"
    assert eta(AT, None) == "ETA –"
    # One byte formatter: decimal units, three significant digits, the unit by the figure shown.
    sizes = [0, 512, 999_600, 5_800_000, 40e9, 161e9, 10**18]
    assert [byte_size(n) for n in sizes] == [
        "0 B", "512 B", "1.00 MB", "5.80 MB", "40.0 GB", "161 GB", "1,000 PB"
    ]  # fmt: skip


def test_the_progress_card_leads_with_share_eta_rate_and_quality() -> None:
    snap = _snapshot()
    card = progress_card(snap)
    assert card == "82.0 % · ETA 00:55 UTC (24 s) · 64.3k tok/s · quality ok", card
    assert len(card) <= CARD_CUT
    warned = _snapshot(audit={"rows": 9, "checks": {"x": {"figure": 0.2, "status": "warn"}}})
    assert progress_card(warned).endswith("quality warn")
    assert progress_card(_snapshot(audit=None)).endswith("quality –")
    # The card's figure first, the dataset's name after it (the key names the dataset).
    described = artifact("generation-progress", "s3://b/regen/run1", card)["description"]
    assert described.startswith("82.0 % · ETA 00:55 UTC") and described.endswith(" · run1")


def test_generated_and_committed_are_named_and_a_stopped_run_shows_what_it_kept() -> None:
    """The issue's stopped run: `496 / 6,000 rows (8.27 %)`, `Progress: 8%` and 0 committed
    side by side. Each count now says which it is, and the bar shows what the dataset holds."""
    stopped = _snapshot(done=496, rows_committed=0, audit=None).as_ended(
        "stopped: canary gate stopped the run after 256 rows: empty_answer 90.2 %"
    )
    assert rows_line(stopped) == "496 / 6,000 rows generated (8.27 %), 0 committed"
    headline = progress_headline(stopped)
    assert headline.startswith("496 / 6,000 rows generated (8.27 %), 0 committed")
    assert stopped.shown_fraction == 0.0, "the bar of a stopped run is what it committed"
    card = progress_card(stopped)
    assert card.startswith("stopped · 0 / 6,000 committed (496 generated) · canary gate"), card
    assert "ETA" not in card and stopped.eta_s is None
    running = _snapshot()
    assert running.shown_fraction == running.fraction == 0.82
    assert "4,920 / 6,000 rows generated (82.0 %), 4,500 committed" in progress_headline(running)


def test_a_finished_run_shows_run_averages_and_one_throughput() -> None:
    """Server-3 read 775 tok/s, its last minute's drain, beside peers at 4,000; the summary
    said another total than the headline. Once over, every figure is the run's average."""
    meter = ProgressMeter(100, window_s=60.0)
    start = _stats(0.0, 0, (0, 0))
    meter.snapshot(replace(start, monotonic=meter._started))
    t0 = meter._started
    meter.snapshot(_stats(t0 + 100.0, 90, (400_000, 396_000)))
    # The last 60 s: server-1 drains its last rows, server-0 is done.
    last = meter.snapshot(_stats(t0 + 160.0, 100, (400_000, 400_000)))
    assert last.servers[1].tokens_per_s == pytest.approx(4000 / 60)  # the drain
    ended = last.as_ended("finished")
    assert ended.tokens_per_s == pytest.approx(800_000 / 160)
    assert [s.tokens_per_s for s in ended.servers] == pytest.approx([2500.0, 2500.0])
    # One total: the headline's, the summary's and the card's are the same figure.
    rates = set(re.findall(r"([\d.,]+k?) (?:output )?tok/s", progress_markdown(ended)))
    assert rates == {sig(ended.tokens_per_s)}, progress_markdown(ended)
    card = progress_card(ended)
    assert "5k tok/s" in card or "5.00k tok/s" in card, card
    assert "run average" in progress_headline(ended)
    # The fleet-live table of a finished run shows the same averages, from the dispatcher.
    metrics = ServerMetrics(1, 0, 100.0, 0.1, None, 400_000.0)
    live = LiveReport(
        AT,
        ended,
        tuple(ServerFigures(f"server-{i}", f"http://s{i}", metrics, 66.7) for i in range(2)),
    )
    table = live.to_markdown()
    assert table.count("| 2,500 |") == 2 and "66.7" not in table, table
    assert "tok/s the run's average" in table


def test_a_rehearsal_with_faults_is_named_for_them(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts6k.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    clean = rehearsal_config(prompts=str(prompts), out=str(tmp_path / "a"))
    fault = rehearsal_config(
        prompts=str(prompts), out=str(tmp_path / "b"), faults=["empty-answer=0.87"]
    )
    assert run_name(clean) == "rehearsal-qwen3-emu-prompts6k"
    assert run_name(fault) == "rehearsal-qwen3-emu-prompts6k-empty-answer-0-87"
    assert "fault:empty-answer=0.87" in run_tags(fault)
    one = fault.model_copy(deep=True)
    one.engine.emulator.faults = []
    one.engine.emulator.server_faults = {2: ["truncate=0.5"]}
    assert run_name(one) == "rehearsal-qwen3-emu-prompts6k-server-2-truncate-0-5"
    assert isinstance(clean, RegenConfig)


def test_the_dataset_card_ends_with_an_export_command_the_cli_takes() -> None:
    from flows.cli import _parser

    text = dataset_markdown("s3://bucket/regen/run1", "240 rows committed")
    block = re.search(r"```\n(regen export .+)\n```", text)
    assert block, text
    args = _parser().parse_args(shlex.split(block.group(1))[1:])
    assert (args.dataset, args.format, args.single_file) == (
        "s3://bucket/regen/run1",
        "tokenized",
        True,
    )
    assert args.out == "s3://bucket/regen/run1-export/tokenized"
    tail = text.strip().splitlines()[-1]
    assert "data.prompts_path=s3://bucket/regen/run1-export/tokenized/tokenized.jsonl" in tail
    assert "speculators" in tail


def test_audit_lengths_are_exact_so_a_bound_stays_a_bound() -> None:
    result = AuditResult(
        dataset="out", rows=6000, planned=6000, verdict="pass", checks=[],
        lengths={"completion_tokens": Quantiles(p1=12.0, p50=1234.0, p99=4096.0)},
    )  # fmt: skip
    text = result.to_markdown()
    assert "| completion_tokens | 12 | 1,234 | 4,096 |" in text, text
    assert "4,100" not in text and "6,000 planned" in text
    assert result.dataset_card() == "6,000 / 6,000 rows committed · audit PASS"


def test_an_error_rows_example_carries_its_reason() -> None:
    from regen.audit.summary import ERROR_REASON_CHARS, error_reason

    reason = "HTTP 400: This model's maximum context length is 40960 tokens.\n" + "x" * 500
    frame = pl.DataFrame({"error": [reason, None, ""]})
    got = frame.select(error_reason().alias("reason"))["reason"].to_list()
    assert got[0].startswith("error row: HTTP 400: This model's maximum context length is 40960")
    assert "\n" not in got[0] and len(got[0]) <= len("error row: ") + ERROR_REASON_CHARS
    assert got[1] == got[2] == "error row"


def test_an_ended_runs_figures_are_kept_not_diluted_by_the_clock(tmp_path: Path) -> None:
    """The fleet-live report, the summary and the flow's result read the ended snapshot at
    different moments: its run average must not fall as the clock goes on."""
    from regen.progress.writer import ProgressWriter
    from regen.storage import LocalStorage

    class Source:
        def stats(self) -> DispatchStats:
            return _stats(time.monotonic(), 100, (400_000, 400_000))

    writer = ProgressWriter(LocalStorage(tmp_path), Source(), total=100, show_bar=False)
    time.sleep(0.05)
    writer.end("finished")
    first = writer.snapshot()
    time.sleep(0.05)
    assert writer.snapshot().tokens_per_s == first.tokens_per_s > 0
    assert writer.snapshot().ended == "finished" and writer.snapshot().eta_s is None


def test_a_share_under_its_threshold_is_never_shown_at_it() -> None:
    from regen.audit.result import Check
    from regen.display.figures import pct_within

    assert pct_within(0.049996, 0.05) == "4.9996 %" and pct_within(0.0499, 0.05) == "4.99 %"
    assert pct_within(0.06, 0.05) == "6.00 %" and pct_within(0.0, 0.01) == "0 %"
    check = Check(
        name="error_rows", title="error rows", status="warn", figure=0.049996, warn=0.01,
        fail=0.05,
    )  # fmt: skip
    result = AuditResult(dataset="out", rows=1, planned=1, verdict="warn", checks=[check])
    assert "| **WARN** | error rows | 4.9996 % | 1.00 % | 5.00 % |" in result.to_markdown()
