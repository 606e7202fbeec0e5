"""The HTTP server: SGLang 0.5.23's routes and answer shapes over the emulated model.

All state lives in one `EmulatorServer` stored on the aiohttp app, so two servers in one
process (or one test) never share anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
import orjson
from aiohttp import web

from regen.emulator.args import DEFAULT_CONTEXT_LENGTH, EmuArgs
from regen.emulator.capacity import Slots
from regen.emulator.metrics import Counters, render
from regen.emulator.model import (
    EmulatedModel,
    Generation,
    Plan,
    message_text,
    parse_reasoning,
)
from regen.emulator.tokenizer import BUNDLED, ChatTokenizer

log = logging.getLogger("regen.emulator")

VERSION = "0.5.23"
# Paths SGLang leaves open with --api-key (sglang/srt/utils/auth.py, prefix match).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
# http_server.py HEALTH_CHECK_TIMEOUT: /health gives up on its 1-token generation after this.
HEALTH_CHECK_TIMEOUT_S = 20.0
# 0.5.23's error `type` strings: a request the pydantic model refuses (FastAPI's validation
# handler: HTTPStatus.BAD_REQUEST.phrase), a ValueError while serving it (context length,
# duplicate rid), and a check of the serving layer itself (empty messages).
INVALID = "Bad Request"
VALUE_ERROR = "BadRequest"
REFUSED = "BadRequestError"
EFFORT_TIERS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, message: str, kind: str = REFUSED) -> web.Response:
    """The OpenAI-style error body SGLang's OpenAI endpoints answer with."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


class RequestError(Exception):
    """A request SGLang would refuse; becomes an error body with `status`."""

    def __init__(self, message: str, status: int = 400, kind: str = REFUSED) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _model_config(model_path: str) -> dict[str, Any]:
    config = Path(model_path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class EmulatorServer:
    """One emulated SGLang server: model, scheduler slots, counters and fault state."""

    def __init__(self, args: EmuArgs) -> None:
        self.args = args
        self.faults = args.faults
        self.config = _model_config(args.model_path)
        self.context_length = (
            args.context_length
            or int(self.config.get("max_position_embeddings") or 0)
            or DEFAULT_CONTEXT_LENGTH
        )
        self.model = _load_model(args)
        self.tokenizer = self.model.tokenizer
        self.slots = Slots(args.max_running_requests)
        self.counters = Counters()
        self.ready = False
        self.startup_time = time.time()
        # Per-request decode speed in simulated tokens/s, and wall seconds per token.
        self.speed = args.tokens_per_s * args.faults.slow
        self.wall_per_token = args.time_scale / self.speed
        self.last_gen_throughput = 0.0
        self._tokens_in_use = 0
        self._aborts: dict[str, asyncio.Future[bool]] = {}
        self._http500 = random.Random(f"http500:{args.seed}")
        self._chat_arrivals = 0
        self._chat_completed = 0
        self._crashing = False
        self._activity = False

    # -- the app -----------------------------------------------------------------------

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
            if scheme.lower() != "bearer" or token != key:
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
        if self._hung:
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
                "weight_version": "default",
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
        state: dict[str, Any] = {
            "last_gen_throughput": self.last_gen_throughput,
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": 0},
        }
        if self.args.speculative_algorithm:
            state["avg_spec_accept_length"] = self.args.accept_length
        info = {
            **self.args.server_args,
            "context_length": self.context_length,
            "startup_time": self.startup_time,
            "internal_states": [state],
            "version": VERSION,
            "frontend": "python",
        }
        return web.json_response(info)

    async def metrics(self, request: web.Request) -> web.Response:
        text = render(
            self.counters,
            model=self.args.served_model_name,
            running=self.slots.running,
            queued=self.slots.queued,
            gen_throughput=self.last_gen_throughput,
            token_usage=self._tokens_in_use / (self.slots.limit * self.context_length),
            accept_length=self.args.accept_length,
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # -- control -----------------------------------------------------------------------

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.slots.running or self.slots.queued:
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
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
        rids = list(self._aborts) if body.get("abort_all") else [str(body.get("rid"))]
        for rid in rids:
            future = self._aborts.get(rid)
            if future is not None and not future.done():
                future.set_result(True)
        return web.Response(status=200)

    # -- generation --------------------------------------------------------------------

    @property
    def _hung(self) -> bool:
        hang = self.faults.hang_after
        return hang is not None and self._chat_arrivals > hang

    async def _run(
        self, rid: str, plan: Plan, budget: int, prompt: int, thinking: bool
    ) -> Generation:
        """Queue for a slot, then sleep the decode time once; an abort cuts it short."""
        out = self.model.generate(plan, budget=budget, thinking=thinking)
        queue_limit = self.args.max_queued_requests
        full = self.slots.running >= self.slots.limit
        if queue_limit is not None and full and self.slots.queued >= queue_limit:
            raise RequestError("The request queue is full.", 503, "ServiceUnavailableError")
        loop = asyncio.get_running_loop()
        aborted: asyncio.Future[bool] = loop.create_future()
        self._aborts[rid] = aborted
        try:
            await self.slots.acquire()
            self._activity = True
            self._tokens_in_use += prompt + out.completion_tokens
            self._note_throughput()
            started = loop.time()
            seconds = out.completion_tokens * self.wall_per_token
            timer = loop.call_later(seconds, _settle, aborted, False)
            try:
                if await aborted:
                    done = int((loop.time() - started) / self.wall_per_token)
                    cut = self.model.generate(plan, budget=min(done, budget), thinking=thinking)
                    out = dataclasses.replace(cut, finish_reason="abort")
            finally:
                timer.cancel()
                self._tokens_in_use -= prompt + out.completion_tokens
                self.slots.release()
                self._note_throughput()
        finally:
            self._aborts.pop(rid, None)
        return out

    def _note_throughput(self) -> None:
        # The decode rate the running batch gives, in simulated tokens/s; kept when idle,
        # like SGLang's "last" gen throughput.
        if self.slots.running:
            self.last_gen_throughput = self.slots.running * self.speed

    def _budget(self, prompt: int, max_tokens: Any) -> int:
        """SGLang's context checks (tokenizer_manager._validate_one_request), same words."""
        ctx = self.context_length
        if prompt >= ctx:
            raise RequestError(
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({ctx} tokens).",
                kind=VALUE_ERROR,
            )
        if max_tokens is None:
            return ctx - prompt
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise RequestError(
                f"max_tokens must be a non-negative integer, got {max_tokens!r}", kind=INVALID
            )
        if prompt + max_tokens > ctx:
            raise RequestError(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {prompt + max_tokens} tokens: {prompt} "
                f"tokens from the input messages and {max_tokens} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion "
                "to fit within the limit.",
                kind=VALUE_ERROR,
            )
        return max_tokens

    async def chat(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        try:
            body = _json_object(await request.read())
            messages = _messages(body)
            thinking = bool(self.args.reasoning_parser)
            kwargs = body.get("chat_template_kwargs") or {}
            if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False:
                thinking = False
            separate = body.get("separate_reasoning", True) is not False
            prompt_ids = self._prompt_ids(messages, kwargs)
            prompt = len(prompt_ids)
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            budget = self._budget(prompt, max_tokens)
            min_tokens = body.get("min_tokens") or 0
            if not isinstance(min_tokens, int):
                raise RequestError(
                    f"min_tokens must be an integer, got {min_tokens!r}", kind=INVALID
                )
            _check_effort(body.get("reasoning_effort"))
            if body.get("stream"):
                _no_ids_when_streaming(body)
        except RequestError as err:
            return error_response(err.status, str(err), err.kind)
        arrival = self._chat_arrivals
        self._chat_arrivals += 1
        hang = self.faults.hang_after
        if hang is not None and arrival >= hang:
            await asyncio.get_running_loop().create_future()  # never answers (sglang#6624)
        http500 = self.faults.fractions.get("http500", 0.0)
        if http500 and self._http500.random() < http500:
            return error_response(500, "Internal server error (emulated).", "InternalServerError")
        rid = str(body.get("rid") or uuid.uuid4().hex)
        if rid in self._aborts:  # tokenizer_manager: a rid still in flight is a ValueError
            return error_response(400, f"Duplicate request ID detected: {rid}", VALUE_ERROR)
        plan = self.model.plan(messages, min_tokens)
        try:
            out = await self._run(rid, plan, budget, prompt, thinking)
        except RequestError as err:
            return error_response(err.status, str(err), err.kind)
        latency = time.monotonic() - started
        self.counters.record(prompt, out.completion_tokens, latency)
        parsed: tuple[str | None, str]
        if not self.args.reasoning_parser or not separate or plan.fault == "think-leak":
            parsed = (None, out.text)  # think-leak: as if the parser had missed the tags
        else:
            parsed = parse_reasoning(out.text, force_reasoning=thinking)
        await self._before_answer()
        if body.get("stream"):
            return await self._stream(request, rid, out, parsed, prompt, body)
        answer = self._completion(rid, out, parsed, prompt_ids, latency, body)
        # orjson, as SGLang's ORJSONResponse: thousands of token ids per answer.
        response = web.Response(body=orjson.dumps(answer), content_type="application/json")
        await response.prepare(request)
        await response.write_eof()
        self._after_answer()
        return response

    async def _before_answer(self) -> None:
        """crash-after=N: the (N+1)th answer is never sent; the process is going down."""
        crash = self.faults.crash_after
        if crash is not None and (self._crashing or self._chat_completed >= crash):
            self._crash()
            await asyncio.get_running_loop().create_future()
        self._chat_completed += 1

    def _after_answer(self) -> None:
        crash = self.faults.crash_after
        if crash is not None and self._chat_completed >= crash:
            self._crash()

    def _crash(self) -> None:
        if not self._crashing:
            self._crashing = True
            log.error("Scheduler hit an exception (emulated fault crash-after); exiting.")
            # A moment for the answer just written to leave the socket buffer.
            asyncio.get_running_loop().call_later(0.05, os._exit, 1)

    def _prompt_ids(self, messages: list[dict[str, Any]], kwargs: Any) -> list[int]:
        """The prompt as the server's chat template renders it, tokenized."""
        if any(not isinstance(m.get("content"), str) for m in messages):
            messages = [{**m, "content": message_text(m.get("content"))} for m in messages]
        try:
            text = self.tokenizer.render(messages, kwargs if isinstance(kwargs, dict) else {})
        except jinja2.TemplateError as err:
            raise RequestError(f"chat template: {err}", kind=VALUE_ERROR) from None
        return self.tokenizer.encode(text)

    def _completion(
        self,
        rid: str,
        out: Generation,
        parsed: tuple[str | None, str],
        prompt_ids: list[int],
        latency: float,
        body: dict[str, Any],
    ) -> dict[str, Any]:
        reasoning, content = parsed
        prompt = len(prompt_ids)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": content,
                "reasoning_content": reasoning,
            },  # 0.5.23 drops a null tool_calls from the message
            "logprobs": None,
            "finish_reason": out.finish_reason,
            "matched_stop": self.model.eos_id if out.finish_reason == "stop" else None,
        }
        # serving_chat drops both keys when not asked for (return_token_ids implies the prompt).
        if body.get("return_token_ids") or body.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = prompt_ids
        if body.get("return_token_ids"):
            choice["response_token_ids"] = out.token_ids
        if body.get("return_meta_info"):
            choice["meta_info"] = self._meta_info(rid, out, prompt, latency)
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.args.served_model_name,
            "choices": [choice],
            "usage": {"prompt_tokens_details": None, **_usage(prompt, out)},
            "metadata": {"weight_version": "default"},
        }

    def _meta_info(self, rid: str, out: Generation, prompt: int, latency: float) -> dict[str, Any]:
        finish: dict[str, Any] = {"type": out.finish_reason}
        if out.finish_reason == "stop":
            finish["matched"] = self.model.eos_id
        elif out.finish_reason == "length":
            finish["length"] = out.completion_tokens
        return {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": prompt,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": 0,
            "spec_accept_length": self.args.accept_length,
            "e2e_latency": latency,
        }

    async def _stream(
        self,
        request: web.Request,
        rid: str,
        out: Generation,
        parsed: tuple[str | None, str],
        prompt: int,
        body: dict[str, Any],
    ) -> web.StreamResponse:
        """SSE in OpenAI's chunk format: the whole output in a few chunks, then [DONE]."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.args.served_model_name,
        }
        reasoning, content = parsed
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if reasoning:
            deltas.append({"reasoning_content": reasoning})
        if content:
            deltas.append({"content": content})
        for i, delta in enumerate(deltas):
            finish = out.finish_reason if i == len(deltas) - 1 else None
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if finish == "stop":
                choice["matched_stop"] = self.model.eos_id
            await response.write(_sse({**base, "choices": [choice]}))
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            usage = _usage(prompt, out)
            await response.write(_sse({**base, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self._after_answer()
        return response

    async def generate(self, request: web.Request) -> web.Response:
        """Native /generate: raw text in, raw text out, no chat template and no parser."""
        started = time.monotonic()
        try:
            body = _json_object(await request.read())
            text = body.get("text")
            if not isinstance(text, str):
                raise RequestError("text must be a string (batches are not emulated)")
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise RequestError("sampling_params must be an object")
            messages = [{"role": "user", "content": text}]
            prompt = len(self.tokenizer.encode(text))
            budget = self._budget(prompt, params.get("max_new_tokens"))
            rid = str(body.get("rid") or uuid.uuid4().hex)
            plan = self.model.plan(messages, int(params.get("min_new_tokens") or 0))
            out = await self._run(rid, plan, budget, prompt, thinking=False)
        except RequestError as err:
            return web.json_response({"error": {"message": str(err)}}, status=err.status)
        latency = time.monotonic() - started
        self.counters.record(prompt, out.completion_tokens, latency)
        return web.json_response(
            {
                "text": out.text,
                "output_ids": out.token_ids,
                "meta_info": self._meta_info(rid, out, prompt, latency),
            }
        )

    async def report_loop(self) -> None:
        """SGLang-like 'Decode batch' lines, so a server log shows load as a real one does."""
        while True:
            await asyncio.sleep(5.0)
            if self._activity or self.slots.running:
                self._activity = False
                log.info(
                    "Decode batch, #running-req: %d, #queue-req: %d, token usage: %.2f, "
                    "accept len: %.2f, gen throughput (token/s): %.2f",
                    self.slots.running,
                    self.slots.queued,
                    self._tokens_in_use / (self.slots.limit * self.context_length),
                    self.args.accept_length,
                    self.last_gen_throughput,
                )


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


def _usage(prompt: int, out: Generation) -> dict[str, Any]:
    """SGLang's UsageInfo: reasoning tokens also in OpenAI's place, only when there are some."""
    reasoning = out.reasoning_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": out.completion_tokens,
        "total_tokens": prompt + out.completion_tokens,
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def _no_ids_when_streaming(body: dict[str, Any]) -> None:
    """serving_chat refuses token ids on a stream (a ValueError there: 400 "BadRequest")."""
    if body.get("return_prompt_token_ids"):
        raise RequestError(
            "return_prompt_token_ids is not supported with streaming. "
            "Please set stream=false when using return_prompt_token_ids=true.",
            kind=VALUE_ERROR,
        )
    if body.get("return_token_ids"):
        raise RequestError(
            "return_token_ids is not supported with streaming on /v1/chat/completions. "
            "Please set stream=false when using return_token_ids=true.",
            kind=VALUE_ERROR,
        )


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise RequestError(f"JSON decode error: {err}", kind=INVALID) from None
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.", kind=INVALID)
    return body


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestError("messages: Field required (a list of messages)", kind=INVALID)
    if not messages:
        raise RequestError("Messages cannot be empty.")  # serving_chat's own check
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}]: each message needs a string 'role'", kind=INVALID)
    return messages


def _check_effort(effort: Any) -> None:
    """0.5.23's ReasoningEffortType: a named tier, or a float in [0, 0.99]; never a bool."""
    if effort is None or effort in EFFORT_TIERS:
        return
    number = isinstance(effort, (int, float)) and not isinstance(effort, bool)
    if number and 0.0 <= effort <= 0.99:
        return
    raise RequestError(
        f"reasoning_effort: Input should be {', '.join(map(repr, EFFORT_TIERS))} "
        f"or a number in [0, 0.99], got {effort!r}",
        kind=INVALID,
    )
