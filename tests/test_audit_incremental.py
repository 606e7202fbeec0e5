"""The incremental audit: shard summaries merge to the figures of all rows at once, are
computed once per settings, and drive the live gate (stop, quarantine) and a canary's gate."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from regen.audit import (
    AuditResult,
    RollingAudit,
    Summary,
    audit_rows,
    judge,
    merge,
    run_audit,
    settings_for,
)
from regen.audit.dataset import open_dataset
from regen.audit.final import row_checks
from regen.audit.lengths import quantile
from regen.audit.rolling import shown_over
from regen.audit.settings import AuditSettings
from regen.config import AuditConfig
from regen.dataset import REJECTS_KEY, commit_shard, read_manifest, read_shard, replace_shard
from regen.dataset.keys import summary_key
from regen.schema import row_schema
from regen.storage import LocalStorage
from tests.support.audit import FINGERPRINT, make_dataset, tiny_tokenizer
from tests.support.summaries import shard_summaries
from tests.test_audit import MIXED
from tests.test_audit_turns import _conversation

CASES: dict[str, dict[str, Any]] = {
    "mixed": {"defects": MIXED},
    "incident_with_tokenizer": {"defects": {"incident": 0.5, "error": 0.02}},
    "thinking_drop": {"thinking": "drop", "defects": {"empty_thinking": 0.3}},
    "bad_server": {"bad_server": 1, "defects": {"collapse": 0.1}},
}


def _rows(storage: LocalStorage) -> pl.DataFrame:
    return open_dataset(storage).scan().collect()


def _settings(storage: LocalStorage, config: AuditConfig, tok: Path | None = None) -> AuditSettings:
    return settings_for(storage, open_dataset(storage), config, tokenizer_path=tok)


def _one_shard_copy(src: LocalStorage, root: Path) -> LocalStorage:
    """The same rows, run.json, rejects and plan ids, committed as a single shard."""
    dst = LocalStorage(root)
    rows = _rows(src).with_columns(shard=pl.lit(0, pl.Int64))
    commit_shard(dst, 0, rows, fingerprint=FINGERPRINT, timings={})
    for key in ("run.json", REJECTS_KEY):
        if src.exists(key):
            dst.write_bytes(key, src.read_bytes(key))
    plan = pl.read_parquet(src.root / "plan.parquet").with_columns(shard=pl.lit(0, pl.Int64))
    plan.write_parquet(root / "plan.parquet")
    return dst


def _comparable(result: AuditResult) -> dict[str, object]:
    """Everything but where the dataset is and how many shards template parity read."""
    out = result.model_dump(exclude={"dataset"})
    for check in out["checks"]:
        if check["name"] == "template_parity":
            check["detail"] = check["detail"].split(" (")[0]
    return out


@pytest.mark.parametrize(
    "kind", ["mixed", "incident_with_tokenizer", "thinking_drop", "bad_server", "multi_turn"]
)
def test_merged_shards_equal_all_rows_at_once(tmp_path: Path, kind: str) -> None:
    """The merge of k shard summaries gives the same AuditResult as one summary of all rows;
    each shard summary's figures are those of its own rows audited alone."""
    tok = tiny_tokenizer(tmp_path / "tok") if kind == "incident_with_tokenizer" else None
    if kind == "multi_turn":
        storage = LocalStorage(tmp_path / "k")
        frame = pl.DataFrame([_conversation(i, 2 if i % 3 else None) for i in range(60)],
                             schema=row_schema())  # fmt: skip
        for shard in range(3):
            part = frame.slice(20 * shard, 20).with_columns(shard=pl.lit(shard, pl.Int64))
            commit_shard(storage, shard, part, fingerprint=FINGERPRINT, timings={})
        storage.write_bytes("run.json", json.dumps({"fingerprint": FINGERPRINT}).encode())
        pl.DataFrame({"id": frame["id"], "shard": [i // 20 for i in range(60)]}).write_parquet(
            storage.root / "plan.parquet"
        )
    else:
        options = CASES[kind]
        storage = make_dataset(tmp_path / "k", rows=1200, shard_size=300, **options).storage
    whole = _one_shard_copy(storage, tmp_path / "one")
    sharded = run_audit(storage, AuditConfig(), tokenizer_path=tok)
    at_once = run_audit(whole, AuditConfig(), tokenizer_path=tok)
    assert _comparable(sharded) == _comparable(at_once)
    assert sharded.verdict != "pass" or kind == "thinking_drop"
    # A summary of all rows in hand is the merge of the shards' summaries, check for check.
    settings = _settings(storage, AuditConfig(), tok)
    parts = shard_summaries(storage, open_dataset(storage), settings).parts
    assert len(parts) > 2
    all_rows = audit_rows(_rows(storage), settings)
    merged = merge(parts)
    assert merged.rows == all_rows.rows and merged.completions == all_rows.completions
    assert merged.lengths == all_rows.lengths and merged.loss == all_rows.loss
    assert row_checks(merged, settings) == row_checks(all_rows, settings)


def test_summary_round_trips_through_json(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, rows=400, shard_size=200, defects=MIXED)
    settings = _settings(ds.storage, AuditConfig())
    summary = audit_rows(_rows(ds.storage), settings)
    assert Summary.model_validate_json(summary.to_json()) == summary
    assert (summary.answers.counts["key"] > 2**32).any()  # polars' u64 hashes survive JSON


def test_quantiles_from_value_counts_are_polars_quantiles() -> None:
    rng = random.Random(7)
    for _ in range(300):
        values = [rng.randint(0, 50) for _ in range(rng.randint(1, 60))]
        counts: dict[int, int] = {}
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        for q in (0.01, 0.5, 0.99):
            assert quantile(counts, q) == pl.Series(values).cast(pl.Float64).quantile(q)
    assert quantile({}, 0.5) is None


def test_second_audit_computes_no_summaries_and_changed_settings_recompute(
    tmp_path: Path,
) -> None:
    ds = make_dataset(tmp_path, rows=800, shard_size=200, defects={"empty": 0.1})
    storage, config = ds.storage, AuditConfig()
    view = open_dataset(storage)
    first = shard_summaries(storage, view, _settings(storage, config))
    assert first.computed == [0, 1, 2, 3]
    key = summary_key(2, _settings(storage, config).key)
    assert storage.exists(key)
    stamp = (tmp_path / key).stat().st_mtime_ns
    assert shard_summaries(storage, view, _settings(storage, config)).computed == []
    result = run_audit(storage, config)
    assert (tmp_path / key).stat().st_mtime_ns == stamp
    assert result.check("empty_answer").figure == pytest.approx(0.1)
    # The gate's policy changes no figure: nothing recomputed. A threshold knob does.
    gate_only = AuditConfig(live="warn", live_min_rows=10)
    assert shard_summaries(storage, view, _settings(storage, gate_only)).computed == []
    knob = AuditConfig(min_answer_tokens=5)
    assert shard_summaries(storage, view, _settings(storage, knob)).computed == [0, 1, 2, 3]
    thinking = settings_for(storage, view, config, thinking_requested=False)
    assert shard_summaries(storage, view, thinking).computed == [0, 1, 2, 3]
    # A replaced shard (new data generation) is summarised again, and only it.
    manifest = read_manifest(storage, 1)
    assert manifest is not None
    fixed = read_shard(storage, manifest).head(5).with_columns(content=pl.lit("fine " * 20))
    replace_shard(storage, 1, fixed, fingerprint=FINGERPRINT, timings={})
    again = shard_summaries(storage, open_dataset(storage), _settings(storage, config))
    assert again.computed == [1]
    # A corrupt stored summary is recomputed, not trusted.
    (tmp_path / key).write_text("{not json")
    assert shard_summaries(storage, open_dataset(storage), _settings(storage, config)).computed == [
        2
    ]


def _shard_stream(storage: LocalStorage, config: AuditConfig) -> list[Summary]:
    settings = _settings(storage, config)
    return shard_summaries(storage, open_dataset(storage), settings).parts


def test_live_gate_stops_on_the_incident_only_after_min_rows(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, rows=3000, shard_size=500, defects={"incident": 0.87})
    config = AuditConfig()
    gate = RollingAudit(_settings(ds.storage, config))
    actions = [gate.update(s) for s in _shard_stream(ds.storage, config)]
    assert [d.action for d in actions] == ["go", "go", "go", "stop", "stop", "stop"]
    stop = actions[3]
    assert stop.figures["rows"] == 2000
    failing = {f.check: f for f in stop.failing}
    assert {"empty_answer", "empty_thinking", "answer_collapse"} <= set(failing)
    assert failing["empty_answer"].figure == pytest.approx(0.87, abs=0.02)
    assert {e.id for e in failing["empty_answer"].examples} <= ds.ids_of("incident")
    assert "empty_answer 8" in stop.reason and "over 2,000 rows" in stop.reason
    assert stop.figures["checks"]["empty_answer"]["status"] == "fail"
    json.dumps(stop.figures)  # progress.json takes it as it is
    # Under `warn` the same figures are reported and the run goes on; `off` judges nothing.
    warn = RollingAudit(_settings(ds.storage, AuditConfig(live="warn")))
    last = [warn.update(s) for s in _shard_stream(ds.storage, config)][-1]
    assert last.action == "go" and {f.check for f in last.failing} >= {"empty_answer"}
    off = judge(
        merge(_shard_stream(ds.storage, config)), _settings(ds.storage, AuditConfig(live="off"))
    )
    assert off.action == "go" and off.failing == [] and off.figures["rows"] == 3000


def test_clean_stream_goes_on(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, rows=2500, shard_size=500, seed=3)
    gate = RollingAudit(_settings(ds.storage, AuditConfig()))
    decisions = [gate.update(s) for s in _shard_stream(ds.storage, AuditConfig())]
    assert all(d.action == "go" and not d.failing and not d.quarantine for d in decisions)


def test_quarantine_picks_the_bad_server_and_the_run_goes_on(tmp_path: Path) -> None:
    """server-2 answers nothing: it is quarantined once, and its rows do not stop the rest
    although they put the fleet's empty-answer rate at 25 % (fail at 5 %)."""
    ds = make_dataset(tmp_path, rows=4000, shard_size=500, bad_server=2)
    gate = RollingAudit(_settings(ds.storage, AuditConfig()))
    decisions = [gate.update(s) for s in _shard_stream(ds.storage, AuditConfig())]
    assert [d.action for d in decisions] == ["go"] * 8
    first = decisions[0].quarantine
    assert [q.server for q in first] == ["server-2"]
    assert first[0].defect == "empty_answer" and first[0].rate == 1.0
    assert set(first[0].examples) <= ds.ids_of("bad_server") and first[0].examples
    assert all(not d.quarantine for d in decisions[1:])
    assert decisions[-1].figures["quarantined"] == ["server-2"]
    assert decisions[-1].figures["checks"]["empty_answer"]["figure"] == pytest.approx(0.25)
    # A quarantined server's rows excuse only its own share: a fleet-wide 30 % still stops.
    fleet = make_dataset(tmp_path / "fleet", rows=2000, shard_size=500, defects={"empty": 0.3})
    both = judge(
        merge(_shard_stream(fleet.storage, AuditConfig())),
        _settings(fleet.storage, AuditConfig()),
        quarantined=frozenset({"server-2"}),
    )
    assert both.action == "stop"  # the healthy servers' own 30 % still stops it


def test_canary_gate_from_one_summary(tmp_path: Path) -> None:
    """A canary's 256 rows spread over shards: row-level checks only, its own min_rows."""
    ds = make_dataset(tmp_path, rows=2000, shard_size=500, defects={"incident": 0.87})
    settings = _settings(ds.storage, AuditConfig())
    canary = _rows(ds.storage).gather_every(8)
    summary = audit_rows(canary, settings)
    assert summary.shards == [0, 1, 2, 3] and summary.rows == 250
    assert judge(summary, settings).action == "go"  # under live_min_rows
    decision = judge(summary, settings, min_rows=200)
    assert decision.action == "stop"
    assert "empty_answer" in {f.check for f in decision.failing}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_a_canary_of_a_few_clean_rows_never_stops(tmp_path: Path, n: int) -> None:
    """n distinct answers: the most common is 1 of n (25 % of 4, over answer_collapse's 20 %),
    which shows no collapse; nor does one truncated row of a few show a run at 20 %."""
    ds = make_dataset(tmp_path, rows=8, shard_size=8, defects={"truncated": 1 / 8})
    settings = _settings(ds.storage, AuditConfig())
    rows = _rows(ds.storage)
    truncated = rows.filter(pl.col("id").is_in(list(ds.ids_of("truncated"))))
    sample = pl.concat([truncated, rows.join(truncated, on="id", how="anti")]).head(n)
    decision = judge(audit_rows(sample, settings), settings, min_rows=0)
    assert decision.action == "go" and decision.failing == [], decision.reason


@pytest.mark.parametrize(
    ("bad", "n", "stops"),
    [(1, 4, False), (2, 4, True), (1, 20, False), (4, 20, True), (223, 256, True)],
)
def test_a_canary_stops_on_what_its_rows_show(
    tmp_path: Path, bad: int, n: int, stops: bool
) -> None:
    """Empty answers (fail at 5 %): 1 of 4 is chance from a run at 5 % (19 %), 2 of 4 is not
    (1.4 %); the incident's 223 of 256 stops at once."""
    ds = make_dataset(tmp_path, rows=n, shard_size=n, defects={"empty": bad / n})
    settings = _settings(ds.storage, AuditConfig())
    decision = judge(audit_rows(_rows(ds.storage), settings), settings, min_rows=0)
    assert decision.action == ("stop" if stops else "go"), decision.reason
    assert ("empty_answer" in {f.check for f in decision.failing}) == stops


def test_the_evidence_bound_meets_the_figure_at_scale() -> None:
    # At a million rows a rate just over the threshold is shown; at 2,000, the noise is not.
    assert shown_over(0.055, 1_000_000, 0.05) and not shown_over(0.0501, 1_000_000, 0.05)
    assert shown_over(0.06, 2000, 0.05) and not shown_over(0.055, 2000, 0.05)
    assert shown_over(0.01, None, 0.01), "a figure that is no sample is judged as it is"
    assert shown_over(0.5, 2, 0.0) and not shown_over(0.0, 2, 0.0)
    assert not shown_over(0.04, 1_000_000, 0.05)


def test_live_gate_keeps_the_answers_it_needs_and_leaves_summaries_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rolling audit bounds its answer table; a collapse stays at its full count, and the
    shard summaries it was fed are not changed."""
    import regen.audit.rolling as gate_module

    monkeypatch.setattr(gate_module, "GATE_ANSWERS", 50)
    ds = make_dataset(tmp_path, rows=2000, shard_size=250, defects={"collapse": 0.3})
    parts = _shard_stream(ds.storage, AuditConfig())
    before = [p.model_copy(deep=True) for p in parts]
    gate = RollingAudit(_settings(ds.storage, AuditConfig()))
    last = [gate.update(p) for p in parts][-1]
    assert parts == before
    assert gate.summary is not None and gate.summary.answers.counts.height == 50
    assert last.action == "stop"
    collapse = {f.check: f for f in last.failing}["answer_collapse"]
    assert collapse.figure == pytest.approx(0.3)
