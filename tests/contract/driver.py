"""Runs inside .venv-sglang (never in regen's venv): sglang 0.5.23's own code as the judge.

One JSON request a line on stdin, one JSON answer a line on stdout, so the seconds importing
sglang costs are paid once per test session. Ops:
- argv {argv}: `prepare_server_args` (regen/fleet/argcheck.py, the preflight's own check);
- flags: the parser's option list, as the emulator vendors it;
- request {body}: ChatCompletionRequest; fields it does not declare are reported as unknown;
- response {kind: chat|stream|error, body}: the response models, unknown fields reported;
- reasoning {text, force}: the qwen3 reasoning parser on a raw generation;
- weight_metadata {completion_tokens, meta_info}: the response `metadata` and meta_info
  fields tokenizer_manager and serving_chat build for an output no weight update touched;
- usage {meta_info, cache_report}: the `usage` serving_chat builds for one answer's meta_info
  (UsageProcessor.calculate_response_usage, with or without --enable-cache-report);
- tools_dump {tools}: each tool's `Tool.model_dump()`, what serving_chat gives the template;
- tool_parse {parser, text, tools}: FunctionCallParser's non-stream parse of a raw answer;
- running_abort: the finish_reason a request cut while running carries, FINISH_ABORT().to_json()
  (what /abort_request, abort_all and a session's end give it);
- queued_abort {rid, prompt_token_ids}: the output tokenizer_manager's own `_handle_abort_req`
  builds for a request the scheduler dropped from its waiting queue (its state stood in for);
- http {body}: POST /v1/chat/completions to an app of sglang's route signature and its own
  RequestValidationError handler (http_server.py's source: the module itself needs uvicorn
  and the whole server), so an invalid body gets the status and text the server answers.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import sys
from functools import cache
from http import HTTPStatus
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
        members = _models(info.annotation)
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            at = f"{where}{name}." if i is None else f"{where}{name}[{i}]."
            # A union's value is one of its members: a key is unknown if none declares it.
            per_member = [set(_unknown(sub, item, at)) for sub in members]
            if per_member:
                found += set.intersection(*per_member)
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


@cache
def _chat_app() -> Any:
    """sglang's own route, validation handler and JSON check, executed from http_server.py's
    source into an app of their own: a valid body would run the real handler, which needs
    the whole server, so the op is for bodies the server refuses."""
    import sglang
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient

    source = Path(sglang.__file__).parent / "srt" / "entrypoints" / "http_server.py"
    tree = ast.parse(source.read_text())
    names = {"validation_exception_handler", "validate_json_request", "openai_v1_chat_completions"}
    found: list[ast.stmt] = [
        node
        for node in tree.body
        if isinstance(node, ast.AsyncFunctionDef)
        and node.name in names
        # two handlers share the name; the other one is for HTTPException
        and "HTTPException" not in ast.unparse(node.args)
    ]
    assert len(found) == 3, [ast.unparse(n)[:60] for n in found]
    app = FastAPI()
    space: dict[str, Any] = {
        "app": app,
        "Depends": Depends,
        "Request": Request,
        "RequestValidationError": RequestValidationError,
        "HTTPStatus": HTTPStatus,
        "ErrorResponse": protocol.ErrorResponse,
        "ChatCompletionRequest": protocol.ChatCompletionRequest,
        "ORJSONResponse": JSONResponse,  # the same content; orjson is not in this env
    }
    # The real file name and line numbers: FastAPI names the endpoint's file and line.
    exec(compile(ast.Module(found, []), str(source), "exec"), space)
    return TestClient(app, raise_server_exceptions=False)


def _queued_abort(rid: str, prompt_token_ids: list[int]) -> dict[str, Any]:
    """Run `TokenizerManager._handle_abort_req` on the AbortReq the scheduler sends for a
    queued request (`_make_abort_req`: nothing decoded, no weight update): the manager and the
    request's state are stood in for with what the method reads, the rest is sglang's code."""
    from types import SimpleNamespace

    with contextlib.redirect_stdout(io.StringIO()):
        from sglang.srt.managers.io_struct import AbortReq
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.utils.weight_versions import compute_weight_version_spans

    out: list[dict[str, Any]] = []
    state = SimpleNamespace(
        finished=False,
        time_stats=SimpleNamespace(set_finished_time=lambda: None, get_e2e_latency=lambda: 0.0),
        obj=SimpleNamespace(stream=False, return_logprob=False),
        output_ids=[],
        get_text=lambda: "",
        prompt_token_ids=prompt_token_ids,
        out_list=out,
        event=SimpleNamespace(set=lambda: None),
    )
    manager = SimpleNamespace(
        rid_to_state={rid: state},
        config_value=lambda key: "default",  # --weight-version's default
        _release_lora_once=lambda state: None,
        incremental_streaming_output=False,
    )
    spans = compute_weight_version_spans([], "default", 0)
    TokenizerManager._handle_abort_req(manager, AbortReq(rid=rid, weight_versions=spans))
    assert state.finished and rid not in manager.rid_to_state
    return out[0]


def handle(req: dict[str, Any]) -> Any:
    op = req["op"]
    if op == "argv":
        return argcheck.check(req["argv"])
    if op == "flags":
        return argcheck.flags()
    if op == "request":
        return _validate(protocol.ChatCompletionRequest, req["body"])
    if op == "sampling_params":
        # What serving_chat hands the scheduler for a valid body (to_sampling_params), as the
        # scheduler's SamplingParams checks it (verify).
        from sglang.srt.sampling.sampling_params import SamplingParams

        request = protocol.ChatCompletionRequest.model_validate(req["body"])
        params = request.to_sampling_params(stop=[], model_generation_config={})
        SamplingParams(**params).verify(vocab_size=req["vocab_size"])
        return {k: params[k] for k in ("sampling_seed", "temperature", "top_p", "top_k")}
    if op == "response":
        return _validate(RESPONSES[req["kind"]], req["body"])
    if op == "reasoning":
        parser = ReasoningParser("qwen3", stream_reasoning=False, force_reasoning=req["force"])
        reasoning, content = parser.parse_non_stream(req["text"])
        return {"reasoning": reasoning, "content": content}
    if op == "weight_metadata":
        from sglang.srt.utils import weight_versions as wv

        n = req["completion_tokens"]
        meta: dict[str, Any] = {"weight_version": "default"}  # --weight-version's default
        spans = wv.compute_weight_version_spans([], "default", n)
        wv.add_weight_versions_to_meta_info(meta, spans, num_output_tokens=n)
        return {"meta_info": meta, "metadata": wv.build_endpoint_weight_version_metadata(meta)}
    if op == "usage":
        from sglang.srt.entrypoints.openai.usage_processor import UsageProcessor

        usage = UsageProcessor.calculate_response_usage(
            [{"meta_info": req["meta_info"]}], enable_cache_report=req["cache_report"]
        )
        return usage.model_dump()
    if op == "tools_dump":
        return [protocol.Tool.model_validate(t).model_dump() for t in req["tools"]]
    if op == "tool_parse":
        from sglang.srt.function_call.function_call_parser import FunctionCallParser

        tools = [protocol.Tool.model_validate(t) for t in req["tools"]]
        parser = FunctionCallParser(tools, req["parser"])
        if not parser.has_tool_call(req["text"]):
            return {"normal": req["text"], "calls": []}
        normal, calls = parser.parse_non_stream(req["text"])
        return {
            "normal": normal,
            "calls": [{"name": c.name, "arguments": c.parameters} for c in calls],
        }
    if op == "running_abort":
        with contextlib.redirect_stdout(io.StringIO()):
            from sglang.srt.managers.schedule_batch import FINISH_ABORT
        return FINISH_ABORT().to_json()
    if op == "queued_abort":
        return _queued_abort(req["rid"], req["prompt_token_ids"])
    if op == "http":
        resp = _chat_app().post(
            "/v1/chat/completions",
            content=req["body"].encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            return {"status": resp.status_code, "body": resp.json()}
        except ValueError:  # a valid body reached the real handler, which has no server
            return {"status": resp.status_code, "body": resp.text}
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
