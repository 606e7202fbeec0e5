"""The real SGLang 0.5.23 server cuts a request (issue 44): POST /abort_request of a request in
flight answers it with a 200 whose finish_reason is abort, which regen reads as a retry, never a
completion; and an abort names every request whose rid *starts with* the one given, which is
why regen's rids are prefix-free (regen.sglang_api.request.turn_request_id).

One server, launched by regen's own fleet code (the tiny twin on this CPU); requests that
ignore the end token decode long enough to be cut, and each step waits on the server's own
running-request gauge, never on a sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from regen.config import SamplingConfig
from regen.machine.ports import quiet_port_range
from regen.sglang_api.answer import read_answer
from regen.sglang_api.request import chat_request_body, turn_request_id
from regen.sglang_api.response import ResponseKind
from support.engine import engine_config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[tuple[str, str]]:
    from regen.config import parse_config
    from regen.fleet import build_server_commands, generate_api_key, launch_fleet

    tmp = tmp_path_factory.mktemp("abort-engine")
    config = parse_config(
        engine_config(tmp, tiny_model, tmp / "none.jsonl", quiet_port_range(1),
                      engine={"servers": 1}),
        "server",
    )  # fmt: skip
    key = generate_api_key()
    commands = build_server_commands(config, tiny_model, key, tmp / "server-work")
    with launch_fleet(config, commands, key) as fleet:
        yield fleet.endpoints[0].url, key.get_secret_value()


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
                f"{self.url}/v1/chat/completions", json=body, headers=self.headers, timeout=300
            )

        thread = threading.Thread(target=post)
        thread.start()
        self.threads.append(thread)

    def abort(self, rid: str) -> None:
        resp = httpx.post(
            f"{self.url}/abort_request", json={"rid": rid}, headers=self.headers, timeout=30
        )
        assert resp.status_code == 200, resp.text

    def running(self) -> int:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.startswith("sglang:num_running_reqs")
        )

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def close(self, rids: list[str]) -> None:
        for rid in rids:
            self.abort(rid)
        for thread in self.threads:
            thread.join(timeout=300)


def _cut(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    assert answer["choices"][0]["finish_reason"] == "abort"
    read = read_answer(resp.status_code, resp.content)
    assert read.kind is ResponseKind.RETRY and read.completion is None, read
    assert "finish_reason abort" in read.reason
    return answer


def test_an_abort_cuts_exactly_regens_rid_and_by_prefix_a_naive_one(
    server: tuple[str, str],
) -> None:
    url, key = server
    ours = [turn_request_id("1", 1, 1), turn_request_id("12", 1, 1)]
    naive = ["1", "12"]  # rids made of the ids as they are
    requests = Requests(url, key)
    try:
        for rid in ours:
            requests.send(rid)
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
        assert first < second < 1500  # it decoded on after the first was cut

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
