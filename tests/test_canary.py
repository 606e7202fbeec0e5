"""The canary: a deterministic sample sent first, its rows sent once and committed once."""

from __future__ import annotations

import io
import time
from concurrent import futures
from pathlib import Path

import polars as pl
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from regen.audit import judge, settings_for
from regen.audit.dataset import open_dataset
from regen.audit.final import row_checks
from regen.audit.result import Example
from regen.audit.rolling import Finding
from regen.audit.summary import audit_rows
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
    send_canary,
    split_shard,
    write_stop_record,
)
from regen.canary.stop import judge_input
from regen.canary.store import CANARY_PARTS, Verdict
from regen.client import Dispatcher
from regen.client.tuning import DispatchTuning
from regen.config import AuditConfig
from regen.dataset import commit_shard, prompts_for_shard, read_manifest
from regen.errors import UserError
from regen.generation.live_gate import one_sample
from regen.prompts import REJECTS_SCHEMA
from regen.sglang_api.request import turn_request_id
from regen.storage import LocalStorage
from support.emulator import in_process
from tests.support.audit import make_dataset, tiny_tokenizer
from tests.test_dispatcher import (
    KEY,
    MODEL,
    Gate,
    _wait,
    dispatcher,
    emulators,
    flags,
    prompts,
    served,
)

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


def test_canary_rows_are_sent_once_and_committed_once_in_their_shards(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    cache = _cache(tmp_path / "prompts.parquet", 30, 10)
    sample = canary_sample(cache, [0, 1, 2], 6)
    with emulators(tmp_path, 2) as fleet, dispatcher(fleet) as d:
        canary = send_canary(d, storage, FP, sample).collect()
        assert canary["id"].to_list() == sample["id"].to_list()
        assert canary["shard"].to_list() == sample["shard"].to_list()
        assert canary["error"].null_count() == 6
        # A resumed canary sends none.
        assert send_canary(d, storage, FP, sample).collect().equals(canary)
        source = CanaryFirst(d, read_canary(storage, FP))
        for shard in range(3):
            rows = prompts_for_shard(cache, shard)
            out = source.submit_shard(shard, rows).result()
            assert out["id"].to_list() == rows["id"].to_list()
            commit_shard(storage, shard, out, fingerprint=FP, timings={})
        stats = d.stats()
    # Every id queued and sent once (a hedge's copy aside): canary rows were not sent again.
    assert stats.submitted == stats.sent == 30
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
        canary = send_canary(d, storage, FP, canary_sample(cache, [0], 3)).collect()
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
        title="empty/trivial answers",
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
    with emulators(tmp_path, 2) as fleet, dispatcher(fleet, slots=5) as d:
        pending = send_canary(d, storage, FP, sample)
        verdict: futures.Future[Verdict] = futures.Future()
        held = HeldForCanary(d, sample, verdict)
        outs = {k: held.submit_shard(k, rows) for k, rows in shards.items()}
        canary = pending.collect()
        _idle(d)
        sent = d.stats().sent
        assert sent == 8 + 32, "the canary, then every shard row: no slot waits on the verdict"
        assert not any(o.done() for o in outs.values()), "no shard is handed back before it"
        # Go, with server-0 quarantined: the rows it answered are sent again elsewhere.
        d.quarantine("server-0", "test")
        verdict.set_result(
            Verdict(canary.filter(pl.col("server") != "server-0"), frozenset({"server-0"}))
        )
        got = {k: o.result(timeout=30) for k, o in outs.items()}
        again = d.stats().sent - sent
    for k, rows in got.items():
        assert rows["id"].to_list() == shards[k]["id"].to_list(), "every id once, in order"
        assert set(rows["server"]) == {"server-1"}
    answered_by_0 = canary.filter(pl.col("server") == "server-0").height
    assert answered_by_0 <= again <= answered_by_0 + 32  # server-0's rows, nothing else twice


class _Arrivals(Gate):
    """`Gate`, keeping the order in which the requests reached the servers."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/chat/completions" and not self.open:
            self.order.append((await request.json())["rid"])
        return await super().middleware(request, handler)


@pytest.mark.parametrize("verdict_is", ["go", "stop"])
def test_the_slots_the_canary_frees_stay_busy_until_its_verdict(
    tmp_path: Path, verdict_is: str
) -> None:
    """Every request held at the server and let go one at a time, in the order sent: each
    slot a canary row frees takes a shard row at once, through the canary's tail, however
    many; a go hands every shard back with each id once, and a stop cancels what the slots
    had not taken yet: it is never sent, and nothing is committed."""
    storage = LocalStorage(tmp_path / "out")
    cache = _cache(tmp_path / "prompts.parquet", 40, 10)
    sample = canary_sample(cache, [0, 1, 2, 3], 8)
    shards = {k: prompts_for_shard(cache, k) for k in range(4)}
    ids = [turn_request_id(i, 1, 1) for i in sample["id"]]  # as the servers see them
    gate = _Arrivals()
    with in_process(
        flags(2, time_scale=0.01), served_name=MODEL, api_key=KEY, middlewares=[gate.middleware]
    ) as fleet:
        gate.loop = fleet[0].loop
        # 4 slots; no hedging: a request held here would look like a straggler.
        tuning = DispatchTuning(hedge=False, retry_backoff_s=0.02, probe_backoff_s=0.2)
        with dispatcher(fleet, slots=2, tuning=tuning) as d:
            pending = send_canary(d, storage, FP, sample)
            verdict: futures.Future[Verdict] = futures.Future()
            held = HeldForCanary(d, sample, verdict)
            outs = {k: held.submit_shard(k, rows) for k, rows in shards.items()}
            _wait("the fleet full", lambda: len(gate.held) == 4)
            assert sorted(gate.held) == ids[:4], "the canary goes first"
            _wait("every shard row queued behind it at once", lambda: d.stats().submitted == 40)
            released: list[str] = []
            behind: list[str] = []
            # The canary's last row stays held: its tail, while the rest turn over, well past
            # two waves of the fleet's slots.
            while len(behind) < 4 * 4:
                rid = next(r for r in gate.held if r != ids[-1])
                gate.release(rid)
                released.append(rid)
                _wait("the freed slot taken", lambda: len(gate.held) == 4)
                behind = [r for r in (*released, *gate.held) if r not in ids]
                assert d.stats().in_flight == 4, "no slot idle while the canary runs"
            assert ids[-1] in gate.held
            assert sorted(gate.order[:8]) == ids, "the canary's rows were sent before any shard's"
            sent = d.stats().sent
            assert sent == 8 + len(behind) < 40
            if verdict_is == "stop":
                stop = CanaryStopped("the canary failed")
                d.abort(stop)
                verdict.set_exception(stop)
                gate.release_all()
                for out in outs.values():
                    with pytest.raises(CanaryStopped):
                        out.result(timeout=30)
                _idle(d)
                assert d.stats().sent == sent, "nothing sent after the stop"
                assert not storage.list("shards/"), "nothing committed"
                return
            gate.release_all()
            canary = pending.collect()
            assert not any(o.done() for o in outs.values()), "no commit before the verdict"
            verdict.set_result(Verdict(canary, frozenset()))
            got = {k: o.result(timeout=30) for k, o in outs.items()}
            assert d.stats().sent == 40, "every id sent once"
    for k, rows in got.items():
        assert rows["id"].to_list() == shards[k]["id"].to_list(), "every id once, in order"
        assert rows["error"].null_count() == rows.height


def test_a_canary_is_sent_in_parts_judged_as_they_come_back(tmp_path: Path) -> None:
    """The parts are consecutive rows of the sample, queued in order; each comes back once,
    the stored rows of a cut-short run first; `collect` stores and returns the whole sample."""
    storage = LocalStorage(tmp_path / "out")
    cache = _cache(tmp_path / "prompts.parquet", 200, 50)
    sample = canary_sample(cache, [0, 1, 2, 3], 80)
    with served(2) as fleet, dispatcher(fleet) as d:
        send_canary(d, storage, FP, sample.head(16)).collect()  # a run cut short after 16 rows
        pending = send_canary(d, storage, FP, sample, parts=4)
        assert [todo.height for todo, _ in pending.parts] == [16, 16, 16, 16]
        assert pl.concat([t for t, _ in pending.parts])["id"].to_list() == ids_of(sample)[16:]
        assert pending.sent == 64
        seen = dict(pending.arrived())
        assert min(seen) == 0 and ids_of(seen[0]) == ids_of(sample)[:16]
        # Each sent part once, alone or with those back at the same time, with its own shards.
        back = pl.concat([seen[k] for k in sorted(seen) if k])
        assert sorted(ids_of(back)) == ids_of(sample)[16:]
        assert back.sort("id")["shard"].to_list() == sample.slice(16)["shard"].to_list()
        rows = pending.collect()
        assert rows.select("id", "shard").equals(sample.select("id", "shard"))
        assert read_canary(storage, FP).height == 80
        assert d.stats().sent == 80, "each canary row sent once"
        # Parts of 16 rows at least: a canary of 8 is one part, of 256 the default 8.
        small = send_canary(d, LocalStorage(tmp_path / "small"), FP, sample.head(8))
        assert [todo.height for todo, _ in small.parts] == [8]
        assert small.collect().height == 8
        whole = canary_sample(_cache(tmp_path / "big.parquet", 1000, 250), [0, 1, 2, 3], 256)
        big = send_canary(d, LocalStorage(tmp_path / "big"), FP, whole)
        assert [todo.height for todo, _ in big.parts] == [256 // CANARY_PARTS] * CANARY_PARTS
        big.collect()


def test_a_canary_judged_in_parts_is_judged_as_one_sample(tmp_path: Path) -> None:
    """The merge of its parts' summaries gives the checks of one audit of all its rows."""
    ds = make_dataset(tmp_path, rows=2000, shard_size=500, defects={"incident": 0.87})
    storage = ds.storage
    tokenizer = tiny_tokenizer(tmp_path / "tok")
    settings = settings_for(storage, open_dataset(storage), AuditConfig(), tokenizer_path=tokenizer)
    canary = open_dataset(storage).scan().collect().gather_every(8)
    whole = audit_rows(canary, settings)
    parts = {k: audit_rows(canary.slice(k * 32, 32), settings) for k in range(8)}
    merged = one_sample(dict(reversed(parts.items())))  # in part order, however they came
    assert merged.rows == whole.rows == 250
    assert merged.parity == whole.parity  # one shard's worth, each row without prompt ids
    assert row_checks(merged, settings) == row_checks(whole, settings)
    one = judge(whole, settings, min_rows=0)
    assert judge(merged, settings, min_rows=0) == one and one.action == "stop"


def ids_of(rows: pl.DataFrame) -> list[str]:
    return rows["id"].to_list()
