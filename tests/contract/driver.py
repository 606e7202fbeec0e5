"""Runs inside .venv-sglang (never in regen's venv): sglang 0.5.23's own code as the judge.

One JSON request a line on stdin, one JSON answer a line on stdout, so the seconds importing
sglang costs are paid once per test session. Ops:
- argv {argv}: `prepare_server_args` (regen/fleet/argcheck.py, the preflight's own check);
- flags: the parser's option list, as the emulator vendors it;
- request {body}: ChatCompletionRequest; fields it does not declare are reported as unknown;
- response {kind: chat|stream|error, body}: the response models, unknown fields reported;
- reasoning {text, force}: the qwen3 reasoning parser on a raw generation.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

with contextlib.redirect_stdout(io.StringIO()):  # keep import chatter off the answer channel
    from pydantic import BaseModel, ValidationError
    from sglang.srt.entrypoints.openai import protocol
    from sglang.srt.parser.reasoning_parser import ReasoningParser

_spec = importlib.util.spec_from_file_location(
    "argcheck", Path(__file__).resolve().parents[2] / "regen" / "fleet" / "argcheck.py"
)
assert _spec and _spec.loader
argcheck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(argcheck)

RESPONSES: dict[str, type[BaseModel]] = {
    "chat": protocol.ChatCompletionResponse,
    "stream": protocol.ChatCompletionStreamResponse,
    "error": protocol.ErrorResponse,
}


def _unknown(model: type[BaseModel], data: Any, where: str = "") -> list[str]:
    """Keys a model does not declare, recursively through nested models, lists and unions."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    names = {n for n, f in fields.items()} | {f.alias for f in fields.values() if f.alias}
    found = [f"{where}{k}" for k in data if k not in names]
    for name, info in fields.items():
        value = data.get(name, data.get(info.alias) if info.alias else None)
        for sub in _models(info.annotation):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    found += _unknown(sub, item, f"{where}{name}[{i}].")
            else:
                found += _unknown(sub, value, f"{where}{name}.")
    return sorted(set(found))


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out += _models(arg)
    return out


def _validate(model: type[BaseModel], body: Any) -> dict[str, Any]:
    try:
        parsed = model.model_validate(body)
    except ValidationError as err:
        return {"ok": False, "errors": [str(e["loc"]) + ": " + e["msg"] for e in err.errors()]}
    return {"ok": True, "unknown": _unknown(model, body), "parsed": parsed.model_dump(mode="json")}


def handle(req: dict[str, Any]) -> Any:
    op = req["op"]
    if op == "argv":
        return argcheck.check(req["argv"])
    if op == "flags":
        return argcheck.flags()
    if op == "request":
        return _validate(protocol.ChatCompletionRequest, req["body"])
    if op == "response":
        return _validate(RESPONSES[req["kind"]], req["body"])
    if op == "reasoning":
        parser = ReasoningParser("qwen3", stream_reasoning=False, force_reasoning=req["force"])
        reasoning, content = parser.parse_non_stream(req["text"])
        return {"reasoning": reasoning, "content": content}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        try:
            answer = {"result": handle(json.loads(line))}
        except Exception as exc:  # reported to the test, which fails with it
            answer = {"exception": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
