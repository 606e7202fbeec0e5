"""The real SGLang 0.5.23 server cuts a request (issue 44): POST /abort_request of a request in
flight answers it with a 200 whose finish_reason is abort, which regen reads as a retry, never a
completion; and an abort names every request whose rid *starts with* the one given, which is
why regen's rids are prefix-free (regen.sglang_api.request.turn_request_id).

The lane's one server (`one_server`, launched by regen's own fleet code with the tiny twin on
this CPU); requests that ignore the end token decode long enough to be cut, and each step waits
on the server's own running-request gauge, never on a sleep, with HANG_GUARD_S as its hang
guard. Whatever way the test ends, every request it sent is aborted, so the server it shares
is left idle.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from regen.config import SamplingConfig
from regen.sglang_api.answer import read_answer
from regen.sglang_api.request import chat_request_body, turn_request_id
from regen.sglang_api.response import ResponseKind
from support.engine import HANG_GUARD_S

# The way out after a failure: the requests' answers come back once aborted; a server too
# wedged to answer an abort within this is no reason to hold the lane (its threads are
# daemons, and the server is stopped at the session's end).
_CLEANUP_S = 60.0


class Requests:
    """Chat requests sent from threads, each answer kept by its rid."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.answers: dict[str, httpx.Response] = {}
        self.threads: list[threading.Thread] = []

    def send(self, rid: str) -> None:
        # The planted answer ends at 16 tokens; ignoring the end token, it runs to the budget.
        body = chat_request_body("tiny", [{"role": "user", "content": f"count {rid}"}],
                                 SamplingConfig(max_tokens=1500), rid=rid)  # fmt: skip
        body["ignore_eos"] = True

        def post() -> None:
            self.answers[rid] = httpx.post(
                f"{self.url}/v1/chat/completions", json=body, headers=self.headers,
                timeout=HANG_GUARD_S,
            )  # fmt: skip

        thread = threading.Thread(target=post, daemon=True)
        thread.start()
        self.threads.append(thread)

    def abort(self, rid: str, timeout: float = HANG_GUARD_S) -> None:
        resp = httpx.post(
            f"{self.url}/abort_request", json={"rid": rid}, headers=self.headers, timeout=timeout
        )
        assert resp.status_code == 200, resp.text

    def running(self) -> int:
        text = httpx.get(f"{self.url}/metrics", timeout=HANG_GUARD_S).text
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.startswith("sglang:num_running_reqs")
        )

    def wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        while not done():
            assert time.monotonic() < deadline, f"no {what} in {HANG_GUARD_S} s"
            time.sleep(0.05)

    def close(self, rids: list[str]) -> None:
        """Abort every request sent (an abort of one already answered does nothing)."""
        for rid in rids:
            with contextlib.suppress(httpx.HTTPError, AssertionError):
                self.abort(rid, timeout=_CLEANUP_S)
        for thread in self.threads:
            thread.join(timeout=_CLEANUP_S)


def _cut(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    assert answer["choices"][0]["finish_reason"] == "abort"
    read = read_answer(resp.status_code, resp.content)
    assert read.kind is ResponseKind.RETRY and read.completion is None, read
    assert "finish_reason abort" in read.reason
    return answer


def test_an_abort_cuts_exactly_regens_rid_and_by_prefix_a_naive_one(
    one_server: tuple[str, str],
) -> None:
    url, key = one_server
    ours = [turn_request_id("1", 1, 1), turn_request_id("12", 1, 1)]
    naive = ["1", "12"]  # rids made of the ids as they are
    requests = Requests(url, key)
    try:
        # The one left running goes in first, so at every step it holds at least as many
        # tokens as the one cut: sent together, it could lag a step behind and, with no step
        # between the two aborts on a slow machine, end one token short (CI read 57 and 56).
        requests.send(ours[1])
        requests.wait("the first running", lambda: requests.running() == 1)
        requests.send(ours[0])
        requests.wait("both running", lambda: requests.running() == 2)
        requests.abort(ours[0])
        requests.wait("the cut answer", lambda: ours[0] in requests.answers)
        # The gauge catches up within a few decode steps; had the abort cut the other request
        # too, it would read 0 and that answer would be back.
        requests.wait(
            "one left running", lambda: requests.running() == 1 or ours[1] in requests.answers
        )
        assert ours[1] not in requests.answers, "the abort of one rid cut the other"
        first = _cut(requests.answers[ours[0]])["usage"]["completion_tokens"]
        requests.abort(ours[1])
        requests.wait("the other cut answer", lambda: ours[1] in requests.answers)
        second = _cut(requests.answers[ours[1]])["usage"]["completion_tokens"]
        assert first <= second < 1500  # it decoded on, never cut short with the first

        # The same two rows with their ids for rids: the abort of "1" cuts "12" as well.
        for rid in naive:
            requests.send(rid)
        requests.wait("both running", lambda: requests.running() == 2)
        requests.abort(naive[0])
        requests.wait("both answers", lambda: set(naive) <= set(requests.answers))
        for rid in naive:
            assert _cut(requests.answers[rid])["usage"]["completion_tokens"] < 1500
    finally:
        requests.close([*ours, *naive])
