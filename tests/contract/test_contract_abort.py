"""An answer the server cut short, judged by sglang 0.5.23's own code (issue 44).

The emulator's abort (the `abort` fault, and /abort_request of a running or a queued request)
is a ChatCompletionResponse with no field sglang does not declare; its finish reason is the one
sglang's FINISH_ABORT or tokenizer manager builds, its usage the one sglang computes from that
meta_info; and regen reads every one of them as a retry, never a completion.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from regen.sglang_api.answer import read_answer
from regen.sglang_api.response import ResponseKind
from tests.contract._sglang import Sglang
from tests.contract.test_contract_protocol import COMMON, KEY, Emu, _body, _check
from tests.support.fleet import SERVED

SERVERS = {
    "abort": ["--emu-time-scale", "0.01", "--emu-fault", "abort=1"],
    # One slot and slow decoding: a second request waits in the queue.
    "one-slot": ["--emu-time-scale", "1", "--max-running-requests", "1", "--enable-metrics",
                 "--emu-reasoning-tokens", "2000:2000"],
}  # fmt: skip


@pytest.fixture(scope="module")
def emus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Emu]]:
    logs = tmp_path_factory.mktemp("contract-abort")
    started: dict[str, Emu] = {}
    try:
        for name, flags in SERVERS.items():
            started[name] = Emu.launch(logs, *COMMON, *flags, served_name=SERVED, api_key=KEY)
        deadline = time.monotonic() + 60
        for emu in started.values():
            emu.wait_ready(deadline=deadline)
        yield started
    finally:
        for emu in started.values():
            emu.stop()


def _judged(sglang: Sglang, resp: httpx.Response) -> dict[str, Any]:
    """The cut answer as sglang's models read it; regen reads it as a retry."""
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    parsed = _check(sglang, "chat", answer)
    choice = parsed["choices"][0]
    assert choice["finish_reason"] == "abort" and choice["matched_stop"] is None
    meta = answer["choices"][0]["meta_info"]
    assert answer["usage"] == sglang.ask("usage", meta_info=meta, cache_report=False)
    read = read_answer(resp.status_code, resp.content)
    assert read.kind is ResponseKind.RETRY and "finish_reason abort" in read.reason
    return answer


def test_the_abort_fault_is_sglangs_running_abort(sglang: Sglang, emus: dict[str, Emu]) -> None:
    answer = _judged(sglang, emus["abort"].post(_body(return_meta_info=True)))
    meta = answer["choices"][0]["meta_info"]
    assert meta["finish_reason"] == sglang.ask("running_abort")
    assert meta["completion_tokens"] == answer["usage"]["completion_tokens"]


def _abort(emu: Emu, rid: str) -> None:
    resp = httpx.post(
        f"{emu.url}/abort_request",
        json={"rid": rid},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert resp.status_code == 200 and resp.content == b""


def test_an_abort_request_answers_as_sglang_running_or_queued(
    sglang: Sglang, emus: dict[str, Emu]
) -> None:
    emu = emus["one-slot"]
    answers: dict[str, httpx.Response] = {}

    def send(rid: str) -> None:
        answers[rid] = emu.post(_body(rid=rid, return_meta_info=True, max_completion_tokens=3000))

    workers = [threading.Thread(target=send, args=(rid,)) for rid in ("running", "queued")]
    try:
        workers[0].start()
        deadline = time.monotonic() + 30
        while emu.metric("sglang:num_running_reqs") < 1:  # a wait on state; deadline a guard
            assert time.monotonic() < deadline
            time.sleep(0.02)
        workers[1].start()
        while emu.metric("sglang:num_queue_reqs") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        _abort(emu, "queued")
        workers[1].join(timeout=30)
        assert "queued" in answers and "running" not in answers  # cut at once; the other runs
    finally:
        for rid in ("queued", "running"):
            _abort(emu, rid)
        for worker in workers:
            if worker.ident is not None:  # started
                worker.join(timeout=30)

    running = _judged(sglang, answers["running"])
    assert running["choices"][0]["meta_info"]["finish_reason"] == sglang.ask("running_abort")
    assert 0 < running["usage"]["completion_tokens"] < 2000  # cut part-way

    queued = _judged(sglang, answers["queued"])
    choice = queued["choices"][0]
    real = sglang.ask("queued_abort", rid="queued", prompt_token_ids=choice["prompt_token_ids"])
    meta = choice["meta_info"]
    assert meta | {"e2e_latency": 0.0} == real["meta_info"]
    assert (choice["message"]["content"], choice["message"]["reasoning_content"]) == ("", None)
    assert choice["response_token_ids"] == real["output_ids"] == []
    assert queued["usage"]["prompt_tokens"] == 0  # sglang counts none for a request never run
