"""regen.sglang_api owns the wire: the chat URL, the auth header and regen's request ids are
built there and nowhere else on the client side (the emulator is the server side)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from pydantic import SecretStr

from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import auth_headers, request_id, turn_request_id

ROOT = Path(__file__).resolve().parents[1]
OWNER = ROOT / "regen" / "sglang_api"
SERVER_SIDE = ROOT / "regen" / "emulator"
WIRE = ("/v1/chat/completions", "Bearer ")  # in any string
RIDS = ("regen-probe-", "regen-bench-", "/hedge")  # an f-string's literal part, exactly


def _literals(path: Path) -> set[str]:
    """Every string constant of a file, f-string parts included."""
    tree = ast.parse(path.read_text(), str(path))
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_no_client_module_builds_the_wire_itself() -> None:
    files = [*(ROOT / "regen").rglob("*.py"), *(ROOT / "benches").rglob("*.py")]
    copies = sorted(
        f"{path.relative_to(ROOT)}: {text!r}"
        for path in files
        if not path.is_relative_to(OWNER) and not path.is_relative_to(SERVER_SIDE)
        for text in _literals(path)
        if text in RIDS or ("\n" not in text and any(piece in text for piece in WIRE))
    )
    assert not copies


def test_the_wire_pieces() -> None:
    assert Endpoint(0, "http://h:1/").chat_url == "http://h:1/v1/chat/completions"
    assert Endpoint(0, "http://h:1").url_of("/health") == "http://h:1/health"
    assert auth_headers(SecretStr("k")) == {"Authorization": "Bearer k"}
    assert request_id("probe").startswith("regen-probe-") and request_id("x") != request_id("x")
    assert turn_request_id("a", 1, 1) == "1:a/t1/a1;"
    assert turn_request_id("p-42", 2, 3) == "4:p-42/t2/a3;"
    assert turn_request_id("p-42", 2, 3, hedge=True) == "4:p-42/t2/a3/hedge;"


# Ids that are prefixes of one another, that hold the rid's own separators, digits where the
# length goes, nothing at all, or text past ASCII: none may make one rid a prefix of another.
ADVERSARIAL = [
    "", "1", "12", "123", "1:", "12:", "1:1", "2:12", "a", "a:t2", "a:t2:retry1", "a:hedge",
    "a/t1", "a/t1/a1", "a/t1/a1;", "a;", ";", "/", ":", "1:a/t1/a1;", "10", "100", "0",
    "p-1", "p-10", "p-1/t1", " ", "é", "éé", "e\u0301", "日本", "x" * 99, "x" * 100,
]  # fmt: skip


def test_no_rid_is_a_prefix_of_another() -> None:
    # SGLang's /abort_request cuts every request whose rid starts with the one named
    # (scheduler.py abort_request): a hedge's abort must cut its own copy and no other.
    rids = {
        turn_request_id(i, turn, attempt, hedge=hedge): (i, turn, attempt, hedge)
        for i in ADVERSARIAL
        for turn in (1, 2, 10, 12)
        for attempt in (1, 2, 10, 11)
        for hedge in (False, True)
    }
    assert len(rids) == len(ADVERSARIAL) * 4 * 4 * 2  # every request its own rid
    ordered = sorted(rids)
    # Sorted, a string's extensions follow it at once: checking neighbours checks every pair.
    clashes = [(a, b) for a, b in itertools.pairwise(ordered) if b.startswith(a)]
    assert clashes == []
    # The id is there as it is, readable in a server's log.
    assert all(i in rid for rid, (i, *_) in rids.items())
