"""The canary: a deterministic sample sent first, its rows sent once and committed once."""

from __future__ import annotations

import io
import time
from concurrent import futures
from pathlib import Path

import polars as pl
import pytest

from regen.audit.gate import Finding
from regen.audit.result import Example
from regen.audit.thresholds import AuditConfig
from regen.canary import (
    STOP_KEY,
    CanaryFirst,
    CanaryStopped,
    HeldForCanary,
    RunStopped,
    StopRecord,
    canary_key,
    canary_sample,
    check_not_stopped,
    merge_shard,
    read_canary,
    run_canary,
    send_canary,
    split_shard,
    write_stop_record,
)
from regen.canary.stop import judge_input
from regen.canary.store import Verdict
from regen.client import Dispatcher
from regen.dataset import commit_shard, prompts_for_shard, read_manifest
from regen.errors import UserError
from regen.prompts import REJECTS_SCHEMA
from regen.storage import LocalStorage
from support.emulator import Emulator
from tests.test_dispatcher import dispatcher, emulators, prompts

FP = "f" * 64


def _cache(path: Path, rows: int, shard_size: int) -> Path:
    """A prompt cache as `cache_prompts` writes it: id, shard, messages in plan order."""
    frame = prompts(rows).with_columns(
        (pl.int_range(pl.len(), dtype=pl.Int64) // shard_size).alias("shard")
    )
    frame.select("id", "shard", "messages").write_parquet(path, row_group_size=shard_size)
    return path


def test_sample_is_deterministic_and_spread_over_every_pending_shard(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "prompts.parquet", 100, 10)
    pending = [1, 2, 3, 5, 6, 7, 8, 9]  # 0 and 4 committed
    sample = canary_sample(cache, pending, 16)
    assert sample.height == 16
    assert sample.columns == ["id", "shard", "messages"]
    assert sample["shard"].value_counts().sort("shard")["count"].to_list() == [2] * 8
    assert sample["shard"].is_sorted()  # plan order
    assert sample.equals(canary_sample(cache, pending, 16))
    assert canary_sample(cache, pending, 0).height == 0
    assert canary_sample(cache, pending, 1000).height == 80


def _requests(fleet: list[Emulator]) -> float:
    return sum(e.metric("sglang:e2e_request_latency_seconds_count") for e in fleet)


def test_canary_rows_are_sent_once_and_committed_once_in_their_shards(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    cache = _cache(tmp_path / "prompts.parquet", 30, 10)
    sample = canary_sample(cache, [0, 1, 2], 6)
    with emulators(tmp_path, 2) as fleet, dispatcher(fleet) as d:
        canary = run_canary(d, storage, FP, sample)
        assert canary["id"].to_list() == sample["id"].to_list()
        assert canary["shard"].to_list() == sample["shard"].to_list()
        assert canary["error"].null_count() == 6
        assert run_canary(d, storage, FP, sample).equals(canary)  # a resumed canary sends none
        source = CanaryFirst(d, read_canary(storage, FP))
        for shard in range(3):
            rows = prompts_for_shard(cache, shard)
            out = source.submit_shard(shard, rows).result()
            assert out["id"].to_list() == rows["id"].to_list()
            commit_shard(storage, shard, out, fingerprint=FP, timings={})
        requests = _requests(fleet)
    assert requests == 30  # every id once at the servers: canary rows were not sent again
    committed = pl.concat(
        pl.read_parquet(io.BytesIO(storage.read_bytes(m.data)))
        for m in (read_manifest(storage, k) for k in range(3))
        if m is not None
    )
    assert sorted(committed["id"].to_list()) == sorted(prompts(30)["id"].to_list())
    kept = committed.join(canary.select("id"), on="id", how="semi").sort("id")
    assert kept.equals(canary.sort("id"))  # the canary's own answers, not new ones


def test_a_shard_merge_refuses_an_id_twice_or_missing(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "prompts.parquet", 10, 10)
    storage = LocalStorage(tmp_path / "out")
    rows = prompts_for_shard(cache, 0)
    with emulators(tmp_path, 1) as fleet, dispatcher(fleet) as d:
        canary = run_canary(d, storage, FP, canary_sample(cache, [0], 3))
        todo, done = split_shard(rows, canary)
        assert todo.height == 7 and done.height == 3
        sent = d.submit_shard(0, rows).result(timeout=30)  # canary ids sent again
    with pytest.raises(ValueError, match="do not make up the shard's 10 prompts once each"):
        merge_shard(rows, sent, done)
    with pytest.raises(ValueError, match="do not make up"):
        merge_shard(rows, sent.head(7), done.head(2))


def _record(fingerprint: str) -> StopRecord:
    check = Finding(
        check="empty_answer",
        title="2 empty/trivial answers",
        figure=0.87,
        fail=0.05,
        rows=256,
        examples=[Example(id=f"p-{i:05d}", reason="filler") for i in range(5)],
        detail="223 of 256 completions have an empty, filler or trivial answer",
    )
    return StopRecord(
        fingerprint=fingerprint,
        stage="canary",
        rows_audited=256,
        prompts_sent=256,
        prompts_planned=5000,
        checks=[check],
        canary=canary_key(fingerprint),
    )


def test_an_unchanged_rerun_of_a_stopped_run_is_refused(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    check_not_stopped(storage, FP)  # nothing stopped yet
    storage.write_bytes(canary_key(FP), b"rows")
    write_stop_record(storage, _record(FP))
    with pytest.raises(RunStopped) as refused:
        check_not_stopped(storage, FP)
    message = str(refused.value)
    assert isinstance(refused.value, UserError)
    assert "stopped at the canary after 256 rows: empty_answer 87.0 %" in message
    assert "e.g. ids p-00000, p-00001, p-00002;" in message
    assert "generation.new_output: true or a new output" in message
    assert storage.exists(STOP_KEY)  # a refusal changes nothing

    check_not_stopped(storage, FP, new_output=True)  # the cause was fixed outside the config
    assert not storage.exists(STOP_KEY) and not storage.exists(canary_key(FP))
    aside = storage.list("superseded/")
    assert [k.split("/", 2)[2] for k in aside] == [canary_key(FP), STOP_KEY]
    assert storage.read_bytes(next(k for k in aside if "canary/" in k)) == b"rows"

    write_stop_record(storage, _record(FP))
    check_not_stopped(storage, "0" * 64)  # a changed config goes on
    assert not storage.exists(STOP_KEY)


def test_a_stop_on_the_inputs_rejects_is_judged_again_not_refused(tmp_path: Path) -> None:
    """Stopped before anything was sent (half the input rejected): judging it again costs
    nothing, so a rerun (a fixed file, a looser `audit.rejects`) goes on and is judged anew."""
    storage = LocalStorage(tmp_path / "out")
    rejects = pl.DataFrame(
        {"line": [3, 4, 9], "id": [None, "x", None], "reason": ["not valid JSON"] * 3},
        schema=REJECTS_SCHEMA,
    )
    assert judge_input(storage, FP, rejects, 3, AuditConfig(live="warn")) is None
    loose = AuditConfig.model_validate({"rejects": {"warn": 0, "fail": 0.6}})
    assert judge_input(storage, FP, rejects, 3, loose) is None
    assert not storage.exists(STOP_KEY)
    record = judge_input(storage, FP, rejects, 3, AuditConfig())
    assert record is not None and storage.exists(STOP_KEY)
    assert record.gate_line() == (
        "canary gate stopped the run before generating: rejects 50.0 % (3 of 6 input rows) "
        "(fail at 1.00 %), e.g. line 3, line 4, line 9"
    )
    check_not_stopped(storage, FP)
    assert not storage.exists(STOP_KEY), "set aside, not refused"


def test_a_rerun_that_is_judged_otherwise_goes_on(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    # No canary this time (`canary_prompts: 0`): a canary's stop no longer speaks for it.
    write_stop_record(storage, _record(FP))
    check_not_stopped(storage, FP, canary=False)
    assert not storage.exists(STOP_KEY)
    # Nor for a gate set to warn or off.
    for live in ("warn", "off"):
        write_stop_record(storage, _record(FP))
        check_not_stopped(storage, FP, live=live)
        assert not storage.exists(STOP_KEY)
    # A rolling stop would come again without a canary.
    write_stop_record(storage, _record(FP).model_copy(update={"stage": "rolling"}))
    with pytest.raises(RunStopped, match="stopped in its rolling audit"):
        check_not_stopped(storage, FP, canary=False)


def _idle(d: Dispatcher) -> None:
    deadline = time.monotonic() + 30
    while (s := d.stats()).queued or s.in_flight:
        assert time.monotonic() < deadline, "the dispatcher never drained"
        time.sleep(0.02)


def test_shards_sent_behind_the_canary_commit_only_on_its_verdict(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    cache = _cache(tmp_path / "prompts.parquet", 40, 10)
    sample = canary_sample(cache, [0, 1, 2, 3], 8)
    shards = {k: prompts_for_shard(cache, k) for k in range(4)}
    with emulators(tmp_path, 2) as fleet, dispatcher(fleet) as d:
        pending = send_canary(d, storage, FP, sample)
        verdict: futures.Future[Verdict] = futures.Future()
        held = HeldForCanary(d, sample, verdict, ahead=20)
        outs = {k: held.submit_shard(k, rows) for k, rows in shards.items()}
        canary = pending.collect()
        _idle(d)
        sent = _requests(fleet)
        assert sent == 8 + 20, "the canary, then only `ahead` rows of the shards"
        assert not any(o.done() for o in outs.values()), "no shard is handed back before it"
        # Go, with server-0 quarantined: the rows it answered are sent again elsewhere.
        d.quarantine("server-0", "test")
        verdict.set_result(
            Verdict(canary.filter(pl.col("server") != "server-0"), frozenset({"server-0"}))
        )
        got = {k: o.result(timeout=30) for k, o in outs.items()}
        again = _requests(fleet) - sent
    for k, rows in got.items():
        assert rows["id"].to_list() == shards[k]["id"].to_list(), "every id once, in order"
        assert set(rows["server"]) == {"server-1"}
    answered_by_0 = canary.filter(pl.col("server") == "server-0").height
    assert again >= 12 + answered_by_0  # the 12 held back, server-0's, nothing else twice
    assert again <= 12 + answered_by_0 + 20


def test_a_stop_at_the_canary_hands_no_shard_back(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    cache = _cache(tmp_path / "prompts.parquet", 40, 10)
    sample = canary_sample(cache, [0, 1, 2, 3], 8)
    with emulators(tmp_path, 2) as fleet, dispatcher(fleet) as d:
        pending = send_canary(d, storage, FP, sample)
        verdict: futures.Future[Verdict] = futures.Future()
        held = HeldForCanary(d, sample, verdict, ahead=6)
        outs = [held.submit_shard(k, prompts_for_shard(cache, k)) for k in range(4)]
        pending.collect()
        stop = CanaryStopped("the canary failed")
        d.abort(stop)
        verdict.set_exception(stop)
        for out in outs:
            with pytest.raises(CanaryStopped):
                out.result(timeout=30)
        _idle(d)
        assert _requests(fleet) <= 8 + 6, "the canary and `ahead` rows at most"
