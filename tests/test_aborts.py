"""Aborted and cut answers are never rows (issue 44).

SGLang 0.5.23 answers a request it cut short with a 200 whose finish_reason is "abort"
(regen.sglang_api.abort lists every shape). The dispatcher retries it like a transport error,
within the row's attempts and on another server, and stores an error row with the reason when
none is left; the emulator gives that answer (`--emu-fault abort=FRACTION`, /abort_request)
as 0.5.23 does; the audit fails a dataset that stores one; hedging's aborts name exact rids.
Against emulators served in this process (real HTTP on 127.0.0.1) and, end to end, a
rehearsal.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from pydantic import SecretStr

from regen.audit import run_audit
from regen.client import Dispatcher, DispatchTuning
from regen.config import AuditConfig, GenerationConfig, SamplingConfig
from regen.dataset import read_committed
from regen.emulator.wire import QUEUED_ABORT, RUNNING_ABORT
from regen.schema import row_schema
from regen.sglang_api.abort import QUEUED_ABORT as QUEUED_ABORT_MESSAGE
from regen.sglang_api.answer import read_answer
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.probe import ProbeSettings, ProbeTarget, reprobe
from regen.sglang_api.request import turn_request_id
from regen.sglang_api.response import ResponseKind
from regen.storage import LocalStorage
from support.emulator import InProcessEmulator, in_process
from tests.support.audit import make_dataset
from tests.support.cli import run_regen

MODEL = "emu-model"
KEY = "test-key"


def flags(
    faults: Sequence[Sequence[str]], *, slots: int = 4, extra: Sequence[str] = ()
) -> list[list[str]]:
    """One emulator per entry of `faults` (its --emu-fault specs)."""
    return [
        [
            "--max-running-requests", str(slots), "--context-length", "4096", "--enable-metrics",
            "--emu-load-s", "0", "--emu-tokens-per-s", "250", "--emu-time-scale", "0.1",
            "--emu-seed", str(i), "--emu-reasoning-tokens", "0:10",
            "--emu-answer-tokens", "20:60", *extra,
            *(arg for spec in specs for arg in ("--emu-fault", spec)),
        ]
        for i, specs in enumerate(faults)
    ]  # fmt: skip


@contextmanager
def served(faults: Sequence[Sequence[str]], **kwargs: Any) -> Iterator[list[InProcessEmulator]]:
    with in_process(flags(faults, **kwargs), served_name=MODEL, api_key=KEY) as fleet:
        yield fleet


def prompts(count: int, ids: Sequence[str] | None = None) -> pl.DataFrame:
    ids = list(ids) if ids is not None else [f"p-{i:05d}" for i in range(count)]
    return pl.DataFrame(
        {"id": ids, "messages": [[{"role": "user", "content": f"question {i}?"}] for i in ids]},
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )


def dispatcher(
    fleet: Sequence[InProcessEmulator],
    tuning: DispatchTuning | None = None,
    slots: int = 4,
    **generation: Any,
) -> Dispatcher:
    return Dispatcher(
        [Endpoint(i, e.url) for i, e in enumerate(fleet)],
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=256),
        generation=GenerationConfig.model_validate(generation),
        concurrency_per_server=slots,
        tuning=tuning or DispatchTuning(retry_backoff_s=0.02, probe_backoff_s=0.2),
    )


def _chat(emu: InProcessEmulator, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{emu.url}/v1/chat/completions",
        data=json.dumps({"model": MODEL, **body}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return resp.status, resp.read()


def _wait(what: str, done: Callable[[], bool], timeout: float = 20) -> None:
    """Until `done()`: a wait on state, its timeout only a guard against a hang."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


# -- the shapes of a cut answer ---------------------------------------------------------------


def test_the_abort_fault_answers_a_200_cut_part_way_as_sglang_does() -> None:
    with served([["abort=1"]], extra=["--emu-answer-tokens", "200:200"]) as (emu,):
        body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 256}
        answers = [_chat(emu, body | {"return_meta_info": True}) for _ in range(4)]
    for status, raw in answers:
        choice = json.loads(raw)["choices"][0]
        assert status == 200 and choice["finish_reason"] == "abort"
        assert choice["matched_stop"] is None
        # FINISH_ABORT().to_json(): a cut with no status code, so a 200.
        assert choice["meta_info"]["finish_reason"] == RUNNING_ABORT
        answer = read_answer(status, raw)
        assert answer.kind is ResponseKind.RETRY and answer.completion is None
        assert "aborted" in answer.reason and "finish_reason abort" in answer.reason
    # Cut after some decoding, each at its own point, never at the end.
    tokens = [json.loads(raw)["usage"]["completion_tokens"] for _, raw in answers]
    assert all(n < 210 for n in tokens) and len(set(tokens)) > 1, tokens


def test_a_request_aborted_in_the_queue_is_answered_at_once_with_nothing() -> None:
    # One slot: the second request waits in the queue; aborting it answers it at once (0.5.23
    # drops it from the waiting queue) while the first still runs.
    slow = ["--emu-time-scale", "1", "--emu-answer-tokens", "2000:2000"]
    with served([[]], slots=1, extra=slow) as (emu,):
        scheduler = emu.server.scheduler

        async def scenario() -> list[tuple[int, bytes]]:
            loop = asyncio.get_running_loop()

            def ask(rid: str) -> asyncio.Future[tuple[int, bytes]]:
                body = {"messages": [{"role": "user", "content": rid}], "rid": rid,
                        "max_completion_tokens": 3000, "return_meta_info": True}  # fmt: skip
                return loop.run_in_executor(None, _chat, emu, body)

            first = ask("running")
            while scheduler.batch.running < 1:
                await asyncio.sleep(0.005)
            second = ask("queued")
            while scheduler.batch.queued < 1:
                await asyncio.sleep(0.005)
            assert scheduler.abort("queued") == 1
            queued = await second
            assert not first.done()  # the running one was not cut
            scheduler.abort("running")
            return [await first, queued]

        running, queued = asyncio.run_coroutine_threadsafe(scenario(), emu.loop).result(60)
    choice = json.loads(queued[1])["choices"][0]
    assert queued[0] == 200 and choice["finish_reason"] == "abort"
    assert choice["meta_info"]["finish_reason"] == QUEUED_ABORT
    assert choice["message"]["content"] == "" and choice["message"]["reasoning_content"] is None
    usage = json.loads(queued[1])["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (0, 0)
    assert read_answer(*queued).kind is ResponseKind.RETRY
    assert json.loads(running[1])["choices"][0]["finish_reason"] == "abort"
    assert scheduler.batch.running == 0 and scheduler.tokens_in_use == 0


@pytest.mark.parametrize(
    ("status", "body", "kind", "reason"),
    [
        # A request aborted in the grammar queue (set_finish_with_abort's default 400).
        (400, {"message": QUEUED_ABORT_MESSAGE, "type": "BadRequestError"}, "retry",
         "HTTP 400: Aborted by AbortReq."),
        # The scheduler's own cuts carry a status (tokenizer_manager raises HTTPException).
        (503, {"message": "Request running timeout reached.", "type": "503"}, "retry",
         "HTTP 503: Request running timeout reached."),
        (500, {"message": "Out of memory even after retracting all other requests in the "
               "decode batch. Aborting the last request.", "type": "500"}, "retry",
         "HTTP 500: Out of memory even after"),
        # A refusal of the request itself is not an abort: the same answer again.
        (400, {"message": "Requested token count exceeds the model's maximum context length",
               "type": "BadRequest"}, "rejected", "HTTP 400: Requested token count"),
    ],
    ids=["grammar queue", "running timeout", "out of memory", "refusal"],
)  # fmt: skip
def test_an_abort_with_a_status_is_retried_and_a_refusal_is_not(
    status: int, body: dict[str, Any], kind: str, reason: str
) -> None:
    raw = json.dumps({"object": "error", **body, "param": None, "code": status}).encode()
    answer = read_answer(status, raw)
    assert answer.kind is ResponseKind(kind) and answer.reason.startswith(reason)
    # Only the abort shapes count as the server's cuts; a 5xx is a failure like any other.
    assert answer.cut is (body["message"] == QUEUED_ABORT_MESSAGE)


# -- the dispatcher ---------------------------------------------------------------------------


def test_aborted_answers_are_retried_on_the_server_that_did_not_cut_them() -> None:
    with served([["abort=1"], []]) as fleet:
        rows = prompts(60)
        with dispatcher(fleet, max_attempts=3) as d:
            out = d.submit_shard(0, rows).result(timeout=60)
            stats = d.stats()
    assert out["id"].to_list() == rows["id"].to_list()
    assert out["error"].null_count() == rows.height, out.filter(pl.col("error").is_not_null())
    assert (out["server"] == "server-1").all()
    assert (out["finish_reason"] != "abort").all()
    cutter = stats.servers[0]
    assert cutter.completed == 0 and cutter.failed_attempts > 0
    # Counted against the server that cut them, and only it.
    assert cutter.cut_answers == cutter.failed_attempts and stats.servers[1].cut_answers == 0
    # One cut at most per row: its retry went to the other server.
    assert out["attempts"].max() == 2
    assert stats.retries == int((out["attempts"] - 1).sum()) == cutter.failed_attempts


def test_answers_cut_everywhere_are_error_rows_with_the_reason() -> None:
    with served([["abort=1"], ["abort=1"]]) as fleet:
        rows = prompts(12)
        with dispatcher(fleet, max_attempts=3) as d:
            out = d.submit_shard(0, rows).result(timeout=60)
            stats = d.stats()
    assert out["id"].to_list() == rows["id"].to_list()
    assert out["error"].null_count() == 0 and stats.ok == 0
    assert (out["attempts"] == 3).all()
    assert (
        out["error"]
        .str.contains(
            r"^gave up after 3 attempts: the server aborted the answer after \d+ tokens "
            r"\(finish_reason abort\)$"
        )
        .all()
    ), out["error"].to_list()
    # Nothing of a cut answer is stored as if it were one.
    assert out["content"].is_null().all() and out["finish_reason"].is_null().all()


# Ids that are prefixes of one another: with rids built from them as they were ("1", "12"),
# an abort of "1" cut "12" too, so hedging skipped it and let the copy run to its end.
PREFIX_IDS = ["1", "12", "123", "1234", "1:t2", "1/t1", "10", "100", "1;", "2", "21"]


def test_every_hedge_abort_cuts_exactly_its_own_copy() -> None:
    # server-0 decodes 50 times slower. Once measured (a first shard), a shard's first four
    # rows, ids that prefix one another, go two to each server; server-1 answers the rest,
    # then takes copies of server-0's two, and each row keeps the first answer: the copy's.
    # The stragglers are aborted by rid, each exactly: none skipped, none cutting another.
    with served([["slow=0.02"], []], slots=2) as fleet:
        cuts: list[tuple[str, int]] = []
        for emu in fleet:
            scheduler = emu.server.scheduler
            abort = scheduler.abort

            def counted(rid: str | None, abort: Callable[[str | None], int] = abort) -> int:
                cut = abort(rid)
                cuts.append((str(rid), cut))
                return cut

            scheduler.abort = counted  # type: ignore[method-assign]
        tuning = DispatchTuning(hedge=True, hedge_after=0.0, hedge_min_samples=1)
        rows = prompts(len(PREFIX_IDS), PREFIX_IDS)
        with dispatcher(fleet, tuning, slots=2) as d:
            d.submit_shard(0, prompts(4, ["w-0", "w-1", "w-2", "w-3"])).result(timeout=120)
            _wait("the first shard's copies ended", lambda: d.stats().servers[0].in_flight == 0)
            hedged, cuts[:] = d.stats().hedged, []
            out = d.submit_shard(1, rows).result(timeout=120)
            _wait("every copy ended", lambda: d.stats().servers[0].in_flight == 0)
            stats = d.stats()
    assert out["id"].to_list() == PREFIX_IDS and out["error"].null_count() == len(PREFIX_IDS)
    assert stats.hedged - hedged == 2 == stats.hedge_wins - hedged
    row_of = {turn_request_id(r, 1, 1): r for r in PREFIX_IDS}
    cut_rows = sorted(row_of[rid] for rid, _ in cuts)
    assert len(cut_rows) == 2 and cut_rows[0] in cut_rows[1], cut_rows  # "1" and "123", say
    assert [cut for _, cut in cuts] == [1, 1]  # each its own request, and only it
    # The copies regen aborted itself answer finish_reason abort too: not the server's cuts.
    assert [s.cut_answers for s in stats.servers] == [0, 0]
    assert set(out.filter(pl.col("id").is_in(cut_rows))["server"]) == {"server-1"}


# -- the probe --------------------------------------------------------------------------------


def test_a_probe_does_not_pass_a_server_that_cuts_its_answer() -> None:
    """A cut answer carries what was decoded before the cut as its text: a server that cuts
    every request (overloaded, failing) must not pass its launch or re-probe on it."""
    settings = ProbeSettings(health_timeout_s=5, models_timeout_s=5, generation_timeout_s=10)
    target = ProbeTarget(MODEL, SecretStr(KEY), SamplingConfig(max_tokens=256))
    with served([["abort=1"], []], extra=["--emu-answer-tokens", "200:200"]) as fleet:
        results = [
            asyncio.run(reprobe(Endpoint(i, emu.url), target, settings))
            for i, emu in enumerate(fleet)
        ]
    cutting, clean = results
    assert not cutting.ok and cutting.retryable, cutting
    assert cutting.reason == "generation probe answer was cut short (finish_reason abort)"
    assert clean.ok, clean


# -- the audit --------------------------------------------------------------------------------


@pytest.mark.parametrize(("planted", "status"), [(0.0, "pass"), (0.0025, "fail")])
def test_the_audit_fails_a_dataset_that_stores_an_aborted_answer(
    tmp_path: Path, planted: float, status: str
) -> None:
    ds = make_dataset(tmp_path, rows=400, shard_size=200, defects={"aborted": planted})
    result = run_audit(ds.storage, AuditConfig())
    check = result.check("aborted")
    assert check.status == status
    assert check.figure == pytest.approx(planted)
    assert {e.id for e in check.examples} == ds.ids_of("aborted")
    assert "| aborted answers |" in result.to_markdown()


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.timeout(400)
def test_a_rehearsal_with_aborting_servers_stores_no_aborted_answer(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    proc = run_regen(
        ["rehearse", "--out", "out", "--servers", "2", "--emu-fault", "abort=0.2"],
        regen_env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = read_committed(LocalStorage(tmp_path / "out")).collect()
    assert data["id"].n_unique() == data.height >= 200
    turns = data.explode("turns")["turns"].struct.field("finish_reason")
    assert (data["finish_reason"] == "abort").sum() == 0 and (turns == "abort").sum() == 0
    # A row the servers cut on every attempt (0.2^4 each) is an error row that says so.
    errors = data["error"].drop_nulls()
    assert errors.str.contains("finish_reason abort").all(), errors.to_list()
    assert (data["attempts"] > 1).any()  # cut answers were tried again
    audit = json.loads((tmp_path / "out" / "report" / "audit.json").read_text())
    (aborted,) = [c for c in audit["checks"] if c["name"] == "aborted"]
    assert aborted["status"] == "pass" and aborted["figure"] == 0
