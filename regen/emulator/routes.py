"""The HTTP server: SGLang 0.5.23's routes over the emulated model.

All state lives in one `EmulatorServer` stored on the aiohttp app, so two servers in one
process (or one test) never share anything. The bodies are wire.py's, the pacing and the
run-time faults runtime.py's; a handler here reads a request and puts those together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from regen.emulator import features, tool_calls, wire
from regen.emulator.args import DEFAULT_CONTEXT_LENGTH, EmuArgs
from regen.emulator.metrics import Counters, render
from regen.emulator.model import EmulatedModel, Generation, message_text, parse_reasoning
from regen.emulator.runtime import FaultRuntime, QueuedAbort, Scheduler
from regen.emulator.tokenizer import BUNDLED, ChatTokenizer
from regen.emulator.wire import INVALID, VALUE_ERROR, RequestError, error_response
from regen.errors import UserError

log = logging.getLogger("regen.emulator")

# Paths SGLang leaves open with --api-key (sglang/srt/utils/auth.py, prefix match).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
# http_server.py HEALTH_CHECK_TIMEOUT: /health gives up on its 1-token generation after this.
HEALTH_CHECK_TIMEOUT_S = 20.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _model_config(model_path: str) -> dict[str, Any]:
    config = Path(model_path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class EmulatorServer:
    """One emulated SGLang server: model, scheduler, counters and fault state."""

    def __init__(self, args: EmuArgs) -> None:
        self.args = args
        self.config = _model_config(args.model_path)
        self.context_length = (
            args.context_length
            or int(self.config.get("max_position_embeddings") or 0)
            or DEFAULT_CONTEXT_LENGTH
        )
        self.model = _load_model(args)
        self.tokenizer = self.model.tokenizer
        self.scheduler = Scheduler(args, self.model, self.context_length)
        self.faults = FaultRuntime(args.faults, args.seed)
        self.counters = Counters()
        self.ready = False
        self.startup_time = time.time()
        self.deterministic = bool(args.server_args.get("enable_deterministic_inference"))

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024 * 1024)
        app[SERVER] = self
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/ready", self.liveness)
        r.add_get("/ping", self.liveness)
        r.add_get("/v1/models", self.models)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/generate", self.generate)
        if self.args.enable_metrics:
            r.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.args.api_key
        if key and request.method != "OPTIONS" and not request.path.startswith(OPEN_PREFIXES):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token != key or self.faults.key_rotated:
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # -- probes and info ---------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        """0.5.23's /health: a 1-token generation, polled once a second, 200 once it answers.

        A hung scheduler (the hang fault) never answers it: 503 after HEALTH_CHECK_TIMEOUT_S
        simulated seconds, as the real server logs "Health check failed" and gives up.
        """
        if not self.ready:
            return web.Response(status=503)
        if self.faults.hung:
            await asyncio.sleep(HEALTH_CHECK_TIMEOUT_S * self.args.time_scale)
            log.error(
                "Health check failed. Server couldn't get a response from detokenizer for last "
                "%d seconds.",
                HEALTH_CHECK_TIMEOUT_S,
            )
            return web.Response(status=503)
        await asyncio.sleep(min(1.0, self.args.time_scale))
        return web.Response(status=200)

    async def liveness(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def models(self, request: web.Request) -> web.Response:
        name = self.args.served_model_name
        card = {
            "id": name,
            "object": "model",
            "created": int(self.startup_time),
            "owned_by": "sglang",
            "root": name,  # 0.5.23 puts the served name here, not the path
            "parent": None,
            "max_model_len": self.context_length,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def model_info(self, request: web.Request) -> web.Response:
        if request.path == "/get_model_info":
            log.warning("Endpoint '/get_model_info' is deprecated; use '/model_info'.")
        return web.json_response(
            {
                "model_path": self.args.model_path,
                "served_model_name": self.args.served_model_name,
                "tokenizer_path": self.args.server_args.get("tokenizer_path")
                or self.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": wire.WEIGHT_VERSION,
                "load_format": "auto",
                "reasoning_parser": self.args.reasoning_parser,
                "tool_call_parser": self.args.server_args.get("tool_call_parser"),
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": self.config.get("model_type"),
                "architectures": self.config.get("architectures"),
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """Launch args as SGLang names them (api_key included, as the real one does)."""
        if request.path == "/get_server_info":
            log.warning("Endpoint '/get_server_info' is deprecated; use '/server_info'.")
        scheduler = self.scheduler
        # internal_states[0] as 0.5.23's scheduler reports it (internal_state.py): the
        # running cap it resolved and the KV pool, the limits a client sizes its load by.
        state: dict[str, Any] = {
            "effective_max_running_requests_per_dp": scheduler.max_running,
            "last_gen_throughput": scheduler.last_gen_throughput,
            "memory_usage": {
                "weight": 0.0, "kvcache": 0.0, "token_capacity": scheduler.kv_tokens,
            },
        }  # fmt: skip
        if self.args.speculative_algorithm:
            state["avg_spec_accept_length"] = self.args.accept_length
        info = {
            **self.args.server_args,
            # The scheduler's init info, merged in at the top (utils/common.build_server_info).
            "max_total_num_tokens": scheduler.kv_tokens,
            "context_length": self.context_length,
            "startup_time": self.startup_time,
            "internal_states": [state],
            "version": wire.VERSION,
            "frontend": "python",
        }
        return web.json_response(info)

    async def metrics(self, request: web.Request) -> web.Response:
        text = render(
            self.counters,
            self.scheduler.batch,
            model=self.args.served_model_name,
            accept_length=self.args.accept_length,
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # -- control -----------------------------------------------------------------------

    async def flush_cache(self, request: web.Request) -> web.Response:
        batch = self.scheduler.batch
        if batch.running or batch.queued:
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
        if self.scheduler.cache is not None:
            self.scheduler.cache.clear()
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. (When there are "
            "running or waiting requests, the operation will not be performed.)\n"
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "invalid JSON"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "expected an object"}}, status=400)
        # AbortReq: a missing rid is "", which is ignored unless abort_all.
        rid = body.get("rid") or ""
        self.scheduler.abort(None if body.get("abort_all") else str(rid))
        return web.Response(status=200)

    # -- generation --------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        try:
            body = wire.json_object(await request.read())
            messages = wire.messages_of(body)
            thinking = bool(self.args.reasoning_parser)
            kwargs = body.get("chat_template_kwargs") or {}
            if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False:
                thinking = False
            separate = body.get("separate_reasoning", True) is not False
            prompt_ids = self._prompt_ids(messages, body)
            prompt = len(prompt_ids)
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            budget = wire.token_budget(prompt, max_tokens, self.context_length)
            min_tokens = body.get("min_tokens") or 0
            if not isinstance(min_tokens, int):
                raise RequestError(
                    f"min_tokens must be an integer, got {min_tokens!r}", kind=INVALID
                )
            wire.check_effort(body.get("reasoning_effort"))
            # 0.5.23 passes `seed` on as sampling_seed and samples with it only under
            # --enable-deterministic-inference (sampling_batch_info.py); else it is ignored.
            draw = wire.sampling_seed(body) if self.deterministic else None
            if body.get("stream"):
                wire.no_ids_when_streaming(body)
        except RequestError as err:
            return error_response(err.status, str(err), err.kind)
        await self.faults.arrive()
        if self.faults.http500():
            return error_response(500, "Internal server error (emulated).", "InternalServerError")
        rid = str(body.get("rid") or uuid.uuid4().hex)
        if self.scheduler.in_flight(rid):  # tokenizer_manager: a rid in flight is a ValueError
            return error_response(400, f"Duplicate request ID detected: {rid}", VALUE_ERROR)
        plan = self.model.plan(
            messages, min_tokens, faulty=self.faults.output_faults_on, sampling_seed=draw
        )
        tools, parser = wire.template_tools(body), self.args.server_args.get("tool_call_parser")
        if tool_calls.calls_now(messages, tools, parser):
            assert tools is not None
            call = tool_calls.call_for(tools, plan.digest, self.model.seed)
            plan = dataclasses.replace(plan, call=tool_calls.call_text(call))
        queued = False
        try:
            out, cached = await self.scheduler.run(
                rid, plan, budget, prompt_ids, thinking, cut_at=self.faults.abort_at()
            )
        except RequestError as err:
            return error_response(err.status, str(err), err.kind)
        except QueuedAbort:  # cut before it ran: nothing decoded, answered at once
            queued, out, cached = True, Generation("", [], "abort", 0), 0
        latency = time.monotonic() - started
        if not queued:
            self.counters.record(prompt, out.completion_tokens, latency, cached)
        parsed: wire.Parsed
        if not self.args.reasoning_parser or not separate or plan.fault == "think-leak":
            parsed = (None, out.text)  # think-leak: as if the parser had missed the tags
        else:
            parsed = parse_reasoning(out.text, force_reasoning=thinking)
        calls = None
        if tools and parser in tool_calls.PARSERS:  # serving_chat: the parser reads the answer
            content, calls = tool_calls.parse(parsed[1], tools)
            parsed = (parsed[0], content)
            if calls and out.finish_reason == "stop":
                out = dataclasses.replace(out, finish_reason="tool_calls")
        await self.faults.before_answer()
        model, eos = self.args.served_model_name, self.model.eos_id
        if body.get("stream"):
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
            cache = cached if self.cache_report else None
            for event in wire.stream_events(rid, out, parsed, prompt, model, eos, body, cache):
                await stream.write(event)
            await stream.write_eof()
            self.faults.after_answer()
            return stream
        if queued:
            meta = wire.queued_meta_info(rid, latency)
        else:
            meta = self._meta_info(rid, out, prompt, latency, cached)
        report = self.cache_report
        answer = wire.completion(
            rid, out, parsed, prompt_ids, meta, model, eos, body, report, tool_calls=calls
        )
        # orjson, as SGLang's ORJSONResponse: thousands of token ids per answer.
        response = web.Response(body=orjson.dumps(answer), content_type="application/json")
        await response.prepare(request)
        await response.write_eof()
        self.faults.after_answer()
        return response

    def _prompt_ids(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        """The prompt as the server's chat template renders it, tokenized: the template is
        given what serving_chat.py gives it (tools unless tool_choice is "none",
        reasoning_effort, then chat_template_kwargs)."""
        if any(not isinstance(m.get("content"), str) for m in messages):
            messages = [{**m, "content": message_text(m.get("content"))} for m in messages]
        kwargs: dict[str, Any] = {}
        if body.get("reasoning_effort") is not None:
            kwargs["reasoning_effort"] = body["reasoning_effort"]
        if isinstance(body.get("chat_template_kwargs"), dict):
            kwargs.update(body["chat_template_kwargs"])
        try:
            text = self.tokenizer.render(messages, kwargs, wire.template_tools(body))
        except UserError as err:
            raise RequestError(f"chat template: {err}", kind=VALUE_ERROR) from None
        return self.tokenizer.encode(text)

    def _meta_info(
        self, rid: str, out: Generation, prompt: int, latency: float, cached: int
    ) -> dict[str, Any]:
        return wire.meta_info(
            rid, out, prompt, latency, self.model.eos_id, self.args.accept_length, cached
        )

    @property
    def cache_report(self) -> bool:
        """--enable-cache-report: usage.prompt_tokens_details carries cached_tokens."""
        return bool(self.args.server_args.get("enable_cache_report"))

    async def generate(self, request: web.Request) -> web.Response:
        """Native /generate: raw text in, raw text out, no chat template and no parser."""
        started = time.monotonic()
        try:
            body = wire.json_object(await request.read())
            if body.get("return_hidden_states"):
                return await self._capture(body, started)
            text = body.get("text")
            if not isinstance(text, str):
                raise RequestError("text must be a string (batches are not emulated)")
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise RequestError("sampling_params must be an object")
            messages = [{"role": "user", "content": text}]
            prompt_ids = self.tokenizer.encode(text)
            prompt = len(prompt_ids)
            budget = wire.token_budget(prompt, params.get("max_new_tokens"), self.context_length)
            rid = str(body.get("rid") or uuid.uuid4().hex)
            plan = self.model.plan(messages, int(params.get("min_new_tokens") or 0))
            out, cached = await self.scheduler.run(rid, plan, budget, prompt_ids, thinking=False)
        except RequestError as err:
            return web.json_response({"error": {"message": str(err)}}, status=err.status)
        except QueuedAbort:
            latency = time.monotonic() - started
            meta = wire.queued_meta_info(rid, latency)
            return web.json_response({"text": "", "output_ids": [], "meta_info": meta})
        latency = time.monotonic() - started
        self.counters.record(prompt, out.completion_tokens, latency, cached)
        return web.json_response(
            {
                "text": out.text,
                "output_ids": out.token_ids,
                "meta_info": self._meta_info(rid, out, prompt, latency, cached),
            }
        )

    async def _capture(self, body: dict[str, Any], started: float) -> web.Response:
        """A capture request (regen.emulator.features): the prefill's time, then its states."""
        if not self.args.server_args.get("enable_return_aux_hidden_states"):
            raise RequestError(
                "return_hidden_states needs a server launched with "
                "--enable-return-aux-hidden-states (or --enable-return-hidden-states)"
            )
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            raise RequestError("input_ids must be a non-empty list of token ids")
        if len(ids) >= self.context_length:
            raise RequestError(
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        rid = str(body.get("rid") or uuid.uuid4().hex)
        await asyncio.sleep(len(ids) / self.args.prefill_tokens_per_s * self.args.time_scale)
        states = features.hidden_states_answer(ids, self.capture_indices, self.hidden_size, rid)
        out = Generation(text="", token_ids=[0], reasoning_tokens=0, finish_reason="length")
        meta = self._meta_info(rid, out, len(ids), time.monotonic() - started, 0)
        meta["hidden_states"] = states
        self.counters.record(len(ids), 1, time.monotonic() - started, 0)
        return web.json_response({"text": "", "output_ids": [0], "meta_info": meta})

    @functools.cached_property
    def capture_indices(self) -> tuple[int, ...]:
        return features.capture_indices(self.args.server_args, self.config)

    @property
    def hidden_size(self) -> int:
        return int(self.config.get("hidden_size") or features.DEFAULT_HIDDEN)


SERVER = web.AppKey("emulator", EmulatorServer)


def _load_model(args: EmuArgs) -> EmulatedModel:
    """The model over the tokenizer of --tokenizer-path or the model directory, as SGLang
    loads it; the bundled stand-in where that one cannot spell the emulator's outputs."""
    path = args.server_args.get("tokenizer_path") or args.model_path
    ranges = (args.seed, args.reasoning_tokens, args.answer_tokens, args.faults)
    try:
        return EmulatedModel(*ranges, ChatTokenizer.load(path))
    except ValueError as err:
        log.warning("%s; using the bundled stand-in tokenizer", err)
        return EmulatedModel(*ranges, ChatTokenizer.load(BUNDLED))
