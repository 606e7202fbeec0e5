"""regen.sglang_api owns the wire: the chat URL, the auth header and regen's request ids are
built there and nowhere else on the client side (the emulator is the server side)."""

from __future__ import annotations

import ast
from pathlib import Path

from pydantic import SecretStr

from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import auth_headers, request_id, turn_request_id

ROOT = Path(__file__).resolve().parents[1]
OWNER = ROOT / "regen" / "sglang_api"
SERVER_SIDE = ROOT / "regen" / "emulator"
WIRE = ("/v1/chat/completions", "Bearer ")  # in any string
RIDS = ("regen-probe-", "regen-bench-", ":retry")  # an f-string's literal part, exactly


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
    assert turn_request_id("a", 1, 1) == "a"
    assert turn_request_id("a", 2, 1) == "a:t2"
    assert turn_request_id("a", 2, 3) == "a:t2:retry2"
