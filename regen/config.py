"""`RegenConfig`: the one configuration model, loaded from YAML and used as the flow's parameter.

Every section forbids unknown keys, so a typo is an error that names its dotted path
instead of a silently ignored setting discovered after the GPUs are rented.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from regen.audit.thresholds import AuditConfig
from regen.errors import ConfigError
from regen.export.options import ExportConfig

Port = Annotated[int, Field(ge=1, le=65535)]
# A CPU server's KV cache unless engine.kv_cache_tokens says otherwise (see there).
CPU_KV_CACHE_TOKENS = 65536


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelConfig(_Section):
    """Where the weights come from and under which name the servers serve them."""

    source: str = Field(description="Local directory, s3://bucket/prefix, or hf://org/repo.")
    revision: str | None = Field(default=None, description="HF revision or S3 version tag.")
    served_name: str = Field(min_length=1, description="--served-model-name of every server.")
    stage_dir: Path | None = Field(
        default=None,
        description="Where the model is staged (a RAM disk); default /dev/shm/regen-models/<name>.",
    )
    stage: bool = Field(default=True, description="Copy the model to stage_dir before launch.")
    tokenizer_path: Path | None = Field(
        default=None, description="Tokenizer for the audit's loss-mask check; default the model."
    )

    def staged_path(self) -> Path:
        """The directory the servers load from."""
        if not self.stage:
            return Path(self.source)
        return self.stage_dir or Path("/dev/shm/regen-models") / self.served_name


class SpeculativeConfig(_Section):
    """MTP / EAGLE speculative decoding; NEXTN needs no draft model for Qwen3.5-family models."""

    enabled: bool = True
    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = "NEXTN"
    num_steps: int = Field(default=3, ge=1)
    eagle_topk: int = Field(default=1, ge=1)
    num_draft_tokens: int = Field(default=4, ge=1)
    draft_model_path: Path | None = None


class EmulatorConfig(_Section):
    """Settings only the emulator reads: simulated speed, load time and injected faults."""

    load_s: float = Field(default=0.5, ge=0)
    tokens_per_s: float = Field(default=250.0, gt=0)
    accept_length: float = Field(
        default=3.6, gt=0, description="MTP accept length the emulator reports on /metrics."
    )
    time_scale: float = Field(default=0.01, gt=0, description="Wall seconds per simulated second.")
    seed: int = 0
    reasoning_tokens: str = Field(default="200:4000", pattern=r"^\d+:\d+$")
    answer_tokens: str = Field(default="20:800", pattern=r"^\d+:\d+$")
    faults: list[str] = Field(default_factory=list, description="--emu-fault specs, all servers.")
    server_faults: dict[int, list[str]] = Field(
        default_factory=dict, description="Extra --emu-fault specs by server index."
    )


class BenchConfig(_Section):
    """The fleet's micro-benchmark: a short fixed load per server, to catch a slow GPU early."""

    concurrency: int = Field(default=32, ge=1)
    max_tokens: int = Field(default=256, ge=1)
    budget_s: float = Field(default=20.0, gt=0)
    min_relative_speed: float = Field(
        default=0.5, ge=0, le=1, description="Flag a server below this share of the median."
    )


class EngineConfig(_Section):
    """How the fleet is launched: one server per GPU (or `servers` on the CPU), each on
    base_port + index."""

    kind: Literal["sglang", "emulator", "external"] = "sglang"
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
    launcher: Literal["module", "serve"] = "module"
    gpus: list[Annotated[int, Field(ge=0, le=63)]] = Field(
        default_factory=lambda: [0], min_length=1
    )
    host: str = "127.0.0.1"
    base_port: Port = 30000
    api_key: SecretStr | None = Field(
        default=None, description="Server API key; generated per run when empty."
    )
    reasoning_parser: str | None = "qwen3"
    tool_call_parser: str | None = Field(
        default=None,
        description="SGLang's --tool-call-parser (qwen25 for Qwen3, qwen3_coder, hermes, ...): "
        "the server then parses the calls of rows with tools into message.tool_calls; "
        "without it a call stays text in the answer.",
    )
    speculative: SpeculativeConfig = SpeculativeConfig()
    max_running_requests: int = Field(default=64, ge=1)
    context_length: int = Field(default=40960, ge=256)
    mem_fraction_static: float = Field(default=0.88, gt=0, le=1)
    kv_cache_tokens: int | None = Field(
        default=None,
        ge=1,
        description="--max-total-tokens, the KV cache's size in tokens; default: SGLang sizes "
        "it from mem_fraction_static, except with device cpu, where that share of the "
        "machine's free RAM (15 GB and 29 s per server on a 24 GB box) would be taken: 65536.",
    )
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = Field(default=900.0, gt=0)
    min_servers: int | None = Field(
        default=None, ge=1, description="Go on with this many healthy servers; default all."
    )
    urls: list[str] = Field(default_factory=list, description="Server URLs for kind: external.")
    bench: BenchConfig = BenchConfig()
    emulator: EmulatorConfig = EmulatorConfig()

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.kind == "external" and not self.urls:
            raise ValueError("engine.kind external needs engine.urls")
        if self.device == "cpu" and self.kind != "external" and self.servers is None:
            raise ValueError(
                "engine.device cpu needs engine.servers: how many servers to launch "
                "(there are no GPUs to count)"
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


class SamplingSetting(_Section):
    """One entry of `sampling.mix`: the parameters it sets (the others are the section's) and
    the share of rows drawn to it."""

    share: float = Field(ge=0, le=1, description="Share of rows sampled with this setting.")
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)


class SamplingConfig(_Section):
    """The sampling parameters of every request; part of the run's fingerprint.

    With `mix`, each row is drawn to one of its settings (a hash of the row id, so a retry,
    a resume or another node draws the same); a setting's unset keys are the section's."""

    max_tokens: int = Field(default=4096, ge=1)
    temperature: float = Field(default=0.6, ge=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int = Field(default=20, ge=-1)
    min_p: float = Field(default=0.0, ge=0, le=1)
    mix: list[SamplingSetting] = Field(
        default_factory=list,
        description="Shares of rows per sampling setting, e.g. [{temperature: 0.6, top_p: "
        "0.95, share: 0.7}, {temperature: 1.0, share: 0.3}]; empty: every row is sampled "
        "with the section's values.",
    )

    @field_validator("mix")
    @classmethod
    def _mix_shares(cls, value: list[SamplingSetting]) -> list[SamplingSetting]:
        check_shares([s.share for s in value])
        if len(value) == 1:
            raise ValueError("one setting is no mix: set its values on the section instead")
        return value


def check_shares(shares: list[float]) -> None:
    """Shares of a mix: none negative, summing to 1 (never normalised, so a typo in one share
    cannot silently move the others)."""
    if any(share < 0 for share in shares):
        raise ValueError("shares must not be negative")
    total = sum(shares)
    if shares and abs(total - 1.0) > 1e-6:
        raise ValueError(f"shares sum to {total:g}, expected 1")


# sglang 0.5.23's named tiers (it also takes a float in [0, 0.99], which a share table cannot key).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]


class RegenerationConfig(_Section):
    """What is regenerated: which assistant turns, and what becomes of the model's thinking.

    Part of the run's fingerprint: each setting changes what a stored row holds, except
    `token_ids`, which only adds the server's ids beside the same text (see regen.fingerprint).
    """

    turns: Literal["last", "all"] = Field(
        default="last",
        description="last: answer the final user turn, earlier turns kept as given; "
        "all: regenerate every assistant turn, each on the regenerated history.",
    )
    thinking: Literal["save", "drop", "off"] = Field(
        default="save",
        description="save: think and keep reasoning_content; drop: think, store no reasoning; "
        "off: enable_thinking false.",
    )
    reasoning_effort: dict[ReasoningEffort, float] = Field(
        default_factory=dict,
        description="Share of requests per reasoning_effort, e.g. {low: 0.4, medium: 0.4, "
        "high: 0.2}; empty sends none (for models that take no effort).",
    )
    thinking_mix: dict[bool, float] = Field(
        default_factory=dict,
        description="Share of rows per enable_thinking, e.g. {on: 0.7, off: 0.3} (true/false "
        "too); the rows drawn on follow `thinking` (save or drop); empty: every row follows it.",
    )
    token_ids: bool = Field(
        default=True,
        description="Ask the server for the exact prompt and response token ids "
        "(return_token_ids) and store them per turn, what trainers' input_ids and loss "
        "masks come from; false stores null.",
    )

    @field_validator("reasoning_effort")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        check_shares(list(value.values()))
        return value

    @field_validator("thinking_mix")
    @classmethod
    def _thinking_shares(cls, value: dict[bool, float], info: ValidationInfo) -> dict[bool, float]:
        check_shares(list(value.values()))
        if value and info.data.get("thinking") == "off":
            raise ValueError("needs thinking save or drop (off turns thinking off for every row)")
        return value

    @property
    def enable_thinking(self) -> bool:
        return self.thinking != "off"


class GenerationConfig(_Section):
    """How the dispatcher retries, gives up and reports."""

    max_attempts: int = Field(default=4, ge=1)
    request_timeout_s: float | None = Field(
        default=None, gt=0, description="Default: derived from max_tokens and measured speed."
    )
    fleet_dead_s: float = Field(default=120.0, gt=0)
    retry_errors: bool = Field(default=False, description="Regenerate error rows of done shards.")
    shards: str | None = Field(default=None, pattern=r"^\d*:\d*$", description="e.g. 100:200")
    shard_retries: int = Field(default=2, ge=0)
    progress_interval_s: float = Field(default=2.0, gt=0)
    live_interval_s: float = Field(
        default=30.0, gt=0, description="Fleet figures from /metrics: a log line and an artifact."
    )
    new_output: bool = Field(
        default=False, description="Allow a changed fingerprint: start a fresh dataset."
    )
    # Not fingerprinted (no generation.* setting is): a canary only changes the order rows
    # are sent in, never what a row holds, so datasets made with and without one compare.
    canary_prompts: int = Field(
        default=256,
        ge=0,
        description="Prompts sampled over every pending shard, generated and audited before "
        "the rest is sent; 0 turns the canary off.",
    )


class InputConfig(_Section):
    """How the prompt set is read, and how a rerun treats one that changed since the dataset
    was made. Not fingerprinted: a different input is a new input revision of the same run
    (regen.dataset.plan), never a different run."""

    split: str | None = Field(
        default=None,
        min_length=1,
        description="hf:// prompts without a path: the split whose files are read (a "
        "data_files split of the README.md's configs, else by the file names: "
        "data/<split>-*.parquet, <split>/, <split>.jsonl ...); default train, or the only one.",
    )
    subset: str | None = Field(
        default=None,
        min_length=1,
        description="hf:// prompts without a path: the config_name of the README.md's configs "
        "(default: the card's default config), or without configs the config directory to read.",
    )
    id_column: str | None = Field(
        default=None,
        min_length=1,
        description="The column holding each row's id, e.g. UltraChat's prompt_id; default id.",
    )
    messages_column: str | None = Field(
        default=None,
        min_length=1,
        description="A conversation column under another name ({role, content} or "
        "{from, value} turns); it is then the row's only format column.",
    )

    removed: Literal["keep", "drop"] = Field(
        default="keep",
        description="Rows of ids no longer in the input: keep them in the dataset (audit, "
        "export, read_committed) or drop them from its view (their data stays on disk).",
    )


class RegenConfig(_Section):
    """Everything a run needs; the Prefect flow takes it as its parameter (a form in the UI)."""

    model: ModelConfig
    engine: EngineConfig = EngineConfig()
    prompts: str = Field(
        description="JSONL or Parquet file, glob or prefix, local or s3://, or a Hub dataset "
        "hf://datasets/ORG/NAME[@REVISION][/PATH-OR-GLOB]."
    )
    input: InputConfig = InputConfig()
    output: str = Field(description="Dataset root: a directory or an s3://bucket/prefix.")
    work_dir: Path = Field(default=Path(".regen"), description="Local logs and PID files.")
    sampling: SamplingConfig = SamplingConfig()
    regeneration: RegenerationConfig = RegenerationConfig()
    shard_size: int = Field(default=500, gt=0)
    concurrency_per_server: int | None = Field(
        default=None, gt=0, description="Default: engine.max_running_requests."
    )
    generation: GenerationConfig = GenerationConfig()
    audit: AuditConfig = AuditConfig()
    export: ExportConfig | None = Field(
        default=None, description="Trainer formats written after a passing audit (stage 6)."
    )

    @field_validator("prompts", "output")
    @classmethod
    def _uri(cls, value: str, info: ValidationInfo) -> str:
        if value.startswith("s3://") and not value[len("s3://") :].split("/", 1)[0]:
            raise ValueError(f"{value!r} has no bucket name")
        if value.startswith("hf://") and info.field_name == "prompts":
            from regen.prompts.hub import HubUri  # the one parser of hf:// dataset URIs

            try:
                HubUri.parse(value)
            except ConfigError as err:
                raise ValueError(str(err)) from None
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @property
    def concurrency(self) -> int:
        return self.concurrency_per_server or self.engine.max_running_requests


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem, each naming the dotted key, e.g. `engine.base_port: ...`."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{source}: {_dotted(e['loc'])}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "config") -> RegenConfig:
    """Validate a mapping (from YAML, a flow parameter or a test) into a `RegenConfig`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return RegenConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def read_config_data(path: Path) -> dict[str, Any]:
    """The raw mapping of a YAML config file, with YAML errors named by file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read config: {err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: config file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> RegenConfig:
    """Load a YAML file, apply dotted-key overrides from the CLI, and validate."""
    data = read_config_data(path)
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    return parse_config(data, str(path))


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c` in a nested mapping, creating sections as needed."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
