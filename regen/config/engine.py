"""The engine section: SGLang or the emulator, its launch flags and the fleet's shape."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    SecretStr,
    model_validator,
)

from regen.config.section import Section

Port = Annotated[int, Field(ge=1, le=65535)]
# A CPU server's KV cache unless engine.kv_cache_tokens says otherwise (see there).
CPU_KV_CACHE_TOKENS = 65536
# --max-running-requests with speculative decoding and no cap: the top of SGLang's own sizing
# without speculative decoding (resolve_max_num_reqs: 512 per context of KV, in [2048, 4096]),
# which SGLang still caps at half the KV pool. regen keeps fewer in flight where that is faster.
SPECULATIVE_MAX_RUNNING = 4096


class SpeculativeConfig(Section):
    """MTP / EAGLE speculative decoding; NEXTN needs no draft model for Qwen3.5-family models."""

    enabled: bool = Field(
        default=True, description="Pass the speculative-decoding flags below; false: none."
    )
    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = Field(
        default="NEXTN", description="--speculative-algorithm."
    )
    num_steps: int = Field(default=3, ge=1, description="--speculative-num-steps.")
    eagle_topk: int = Field(default=1, ge=1, description="--speculative-eagle-topk.")
    num_draft_tokens: int = Field(default=4, ge=1, description="--speculative-num-draft-tokens.")
    draft_model_path: Path | None = Field(
        default=None,
        description="--speculative-draft-model-path; none for NEXTN, which uses the model's "
        "own MTP heads.",
    )


class EmulatedGpu(Section):
    """One server's emulated GPU where it differs from the fleet's (a fleet can mix GPUs);
    an unset field keeps the fleet's value."""

    tokens_per_s: float | None = Field(
        default=None, gt=0, description="A lone request's decode speed (simulated tokens/s)."
    )
    batch_knee: int | None = Field(
        default=None,
        ge=0,
        description="Running requests past which a decode step slows with the batch (0: none).",
    )
    kv_tokens: int | None = Field(default=None, ge=1, description="The GPU's KV pool in tokens.")
    prefill_tokens_per_s: float | None = Field(
        default=None, gt=0, description="Uncached prompt tokens prefilled per simulated second."
    )


class EmulatorConfig(Section):
    """Settings only the emulator reads: simulated speed and batch curve, load time and
    injected faults. The curve's defaults and their sources: regen/emulator/gpu.py."""

    load_s: float = Field(default=0.5, ge=0, description="Simulated model load time, seconds.")
    tokens_per_s: float = Field(
        default=250.0, gt=0, description="Simulated decode speed of one request, tokens/s."
    )
    batch_knee: int = Field(
        default=128,
        ge=0,
        description="Running requests past which a decode step slows with the batch, as on a "
        "GPU past its memory-bound regime; 0: no knee (every request at tokens_per_s however "
        "many run, the emulator's linear model).",
    )
    kv_tokens: int = Field(
        default=400_000,
        ge=1,
        description="The emulated GPU's KV pool in tokens (SGLang's max_total_num_tokens; "
        "engine.kv_cache_tokens can only lower it): past it requests queue or are retracted.",
    )
    prefill_tokens_per_s: float = Field(
        default=10_000.0,
        gt=0,
        description="Uncached prompt tokens a server prefills per simulated second.",
    )
    server_gpus: dict[int, EmulatedGpu] = Field(
        default_factory=dict,
        description="Per-server GPUs by server index, where a server differs from the fleet.",
    )
    accept_length: float = Field(
        default=3.6, gt=0, description="MTP accept length the emulator reports on /metrics."
    )
    time_scale: float = Field(default=0.01, gt=0, description="Wall seconds per simulated second.")
    seed: int = Field(default=0, description="Seed of the emulated text and lengths.")
    reasoning_tokens: str = Field(
        default="200:4000",
        pattern=r"^\d+:\d+$",
        description="MIN:MAX length of an emulated reasoning, in tokens.",
    )
    answer_tokens: str = Field(
        default="20:800",
        pattern=r"^\d+:\d+$",
        description="MIN:MAX length of an emulated answer, in tokens.",
    )
    faults: list[str] = Field(default_factory=list, description="--emu-fault specs, all servers.")
    server_faults: dict[int, list[str]] = Field(
        default_factory=dict, description="Extra --emu-fault specs by server index."
    )


class BenchConfig(Section):
    """The fleet's micro-benchmark: a short fixed load per server, to catch a slow GPU early."""

    concurrency: int = Field(default=32, ge=1, description="Requests sent to each server at once.")
    max_tokens: int = Field(default=256, ge=1, description="max_tokens of each request.")
    budget_s: float = Field(
        default=20.0,
        gt=0,
        description="Seconds the load runs; the tokens of requests finished within it are counted.",
    )
    min_relative_speed: float = Field(
        default=0.5, ge=0, le=1, description="Flag a server below this share of the median."
    )


class RelaunchConfig(Section):
    """How a server regen launched comes back when it exits or hangs during generation.

    Not part of the fingerprint: it decides which server answers a row, never the answer.
    """

    max_restarts: int = Field(
        default=3,
        ge=0,
        description="Relaunches one server may have within window_s; a server that would "
        "need one more stays out for the rest of the run (0: never relaunch, a server that "
        "exits or hangs is out at once).",
    )
    window_s: float = Field(
        default=3600.0, gt=0, description="The span max_restarts counts relaunches over."
    )
    backoff_s: float = Field(
        default=10.0,
        ge=0,
        description="Wait before a relaunch, doubled for each earlier one in the window (up "
        "to 8x): what broke it (a GPU freeing its memory, a full disk) may take a moment.",
    )
    hang_s: float = Field(
        default=300.0,
        gt=0,
        description="A server with requests in flight is hung once it has given no sign of "
        "life for this long (no request answered, /health not 200, no token generated per "
        "its /metrics) while another server answered (alone: while its /health fails); a "
        "server its requests' failures took out and whose probes have failed this long is "
        "hung too. SGLang's own watchdog kills a stuck forward pass at 300 s.",
    )


class EngineConfig(Section):
    """How the fleet is launched: one server per GPU (or `servers` on the CPU), each on
    base_port + index."""

    kind: Literal["sglang", "emulator", "external"] = Field(
        default="sglang",
        description="sglang: regen launches SGLang servers; emulator: SGLang-compatible "
        "emulators (what a rehearsal uses); external: attach to running servers at "
        "engine.urls.",
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="cuda: one server per engine.gpus entry; cpu: engine.servers servers "
        "on the CPU (SGLang's --device cpu), no GPU needed or touched.",
    )
    servers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="How many servers with device cpu (required there: there are no GPUs "
        "to count); with cuda the servers are engine.gpus.",
    )
    python: str = Field(
        default=sys.executable,
        description="Interpreter of the venv that has sglang (on a local file system).",
    )
    launcher: Literal["module", "serve"] = Field(
        default="module",
        description="module: python -m sglang.launch_server; serve: the venv's `sglang serve`.",
    )
    gpus: list[Annotated[int, Field(ge=0, le=63)]] = Field(
        default_factory=lambda: [0],
        min_length=1,
        description="With device cuda, one server per GPU index (its CUDA_VISIBLE_DEVICES).",
    )
    host: str = Field(
        default="127.0.0.1",
        description="Address the servers listen on; a non-loopback host needs engine.api_key.",
    )
    base_port: Port = Field(default=30000, description="Server i listens on base_port + i.")
    api_key: SecretStr | None = Field(
        default=None, description="Server API key; generated per run when empty."
    )
    reasoning_parser: str | None = Field(
        default="qwen3",
        description="SGLang's --reasoning-parser, which splits the thinking from the answer; "
        "none: no split.",
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="SGLang's --tool-call-parser (qwen25 for Qwen3, qwen3_coder, hermes, ...): "
        "the server then parses the calls of rows with tools into message.tool_calls; "
        "without it a call stays text in the answer.",
    )
    speculative: SpeculativeConfig = Field(
        default=SpeculativeConfig(), description="Speculative decoding (MTP heads or a draft)."
    )
    max_running_requests: int | None = Field(
        default=None,
        ge=1,
        description="A cap on every server's running requests (--max-running-requests) and on "
        "the requests regen keeps in flight on each; default: SGLang sizes it from the KV pool "
        "and regen measures each server's best concurrency below it.",
    )
    context_length: int = Field(default=40960, ge=256, description="--context-length.")
    mem_fraction_static: float = Field(
        default=0.88, gt=0, le=1, description="--mem-fraction-static."
    )
    kv_cache_tokens: int | None = Field(
        default=None,
        ge=1,
        description="--max-total-tokens, the KV cache's size in tokens; default: SGLang sizes "
        "it from mem_fraction_static, except with device cpu, where that share of the "
        "machine's free RAM (15 GB and 29 s per server on a 24 GB box) would be taken: 65536.",
    )
    deterministic: bool = Field(
        default=False,
        description="--enable-deterministic-inference on every server: SGLang 0.5.23 then "
        "honours each request's seed (and ignores it otherwise), so the same row, seed and "
        "server give the same tokens, and a hedged copy is the same draw; batch-invariant "
        "kernels cost throughput (SGLang measured 34 %). With kind external: the servers "
        "were started so. Not on a CPU (SGLang refuses its torch_native attention there), "
        "and every min_p must be 0 (its seeded sampler has none).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="More flags for every server's command line, checked by SGLang's parser; "
        "a flag regen sets from the config, or one removed in sglang 0.5.23, is refused.",
    )
    startup_timeout_s: float = Field(
        default=900.0, gt=0, description="Seconds a server has to load and pass its probes."
    )
    min_servers: int | None = Field(
        default=None, ge=1, description="Go on with this many healthy servers; default all."
    )
    urls: list[str] = Field(default_factory=list, description="Server URLs for kind: external.")
    bench: BenchConfig = Field(
        default=BenchConfig(), description="The micro-benchmark each server runs after launch."
    )
    relaunch: RelaunchConfig = Field(
        default_factory=RelaunchConfig,
        description="Launched servers (not kind external) that exit or hang are relaunched.",
    )
    emulator: EmulatorConfig = Field(
        default=EmulatorConfig(), description="What the emulator simulates (engine.kind: emulator)."
    )

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.kind == "external" and not self.urls:
            raise ValueError("engine.kind external needs engine.urls")
        if self.device == "cpu" and self.kind != "external" and self.servers is None:
            raise ValueError(
                "engine.device cpu needs engine.servers: how many servers to launch "
                "(there are no GPUs to count)"
            )
        if self.deterministic and self.device == "cpu" and self.kind == "sglang":
            raise ValueError(
                "engine.deterministic needs a GPU: SGLang 0.5.23's deterministic inference "
                "refuses the CPU's torch_native attention backend"
            )
        if self.device == "cuda" and self.servers is not None:
            raise ValueError(
                "engine.servers is for engine.device cpu; with cuda there is one server per "
                "engine.gpus entry"
            )
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"engine.gpus lists a GPU twice: {self.gpus}")
        if self.base_port + self.num_servers - 1 > 65535:
            raise ValueError("engine.base_port + number of GPUs exceeds 65535")
        if self.host not in {"127.0.0.1", "localhost", "::1"} and self.api_key is None:
            raise ValueError(f"engine.host {self.host} is not loopback: set engine.api_key")
        if self.min_servers is not None and self.min_servers > self.num_servers:
            raise ValueError(f"engine.min_servers {self.min_servers} > {self.num_servers} servers")
        return self

    @property
    def num_servers(self) -> int:
        return len(self.urls) if self.kind == "external" else len(self.slots)

    @property
    def launch_max_running(self) -> int | None:
        """--max-running-requests as regen passes it: the cap when set; with speculative
        decoding and no cap, SPECULATIVE_MAX_RUNNING, because 0.5.23 silently forces 48
        there unless it is told a number (speculative_hook.py); None: SGLang sizes it."""
        if self.max_running_requests is not None:
            return self.max_running_requests
        return SPECULATIVE_MAX_RUNNING if self.speculative.enabled else None

    @property
    def max_total_tokens(self) -> int | None:
        """The KV cache's tokens regen asks for (None: SGLang's own sizing)."""
        if self.kv_cache_tokens is None and self.device == "cpu":
            return CPU_KV_CACHE_TOKENS
        return self.kv_cache_tokens

    @property
    def slots(self) -> list[int | None]:
        """The GPU of each server regen launches, in order; None for a CPU server."""
        if self.device == "cpu":
            return [None] * (self.servers or 0)
        return list(self.gpus)
