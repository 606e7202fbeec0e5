"""The launch command of every server, built from the config alone so it can be read and tested.

The API key: SGLang 0.5.23 reads no API-key environment variable (`api_key` in
`python/sglang/srt/server_args.py` is a plain `--api-key` option with default None, and
`entrypoints/http_server.py` only does `if server_args.api_key: add_api_key_middleware(...)`).
What it does read is `--config FILE.yaml` (`srt/server_args_config_parser.py`), whose keys
become flags verbatim. So the key goes into a 0600 YAML file `api-key: K` and argv carries
only `--config <file>`: the key never shows in `ps` or /proc/<pid>/cmdline. The file is
written at launch and removed once the server is up (it is read at argument parsing).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pydantic import SecretStr

from regen.config import EmulatorConfig, EngineConfig, RegenConfig
from regen.errors import ConfigError

log = logging.getLogger(__name__)

# Facts of SGLang 0.5.23, not knobs.
REMOVED_FLAGS = MappingProxyType({"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode"})
DEPRECATED_FLAGS = frozenset({"--disable-cuda-graph"})
# SGLang's CPU path (`--device cpu`): the torch-native attention and sampling backends, the
# only ones that run without CUDA, and no graphs (0.5.23's spelling of the deprecated
# --disable-cuda-graph). SGLang picks the same on a CPU; saying so keeps argv self-evident.
CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
)  # fmt: skip
# What makes 0.5.23 honour a request's seed (sampling_batch_info.py reads it only then).
DETERMINISTIC_FLAG = "--enable-deterministic-inference"
# What sglang reads instead of a flag: without it the scheduler crashes importing CUDA-only
# layers (rotary embeddings from vllm) and the server exits 137.
CPU_ENV = MappingProxyType({"SGLANG_USE_CPU_ENGINE": "1"})
# Flags whose spelling differs from the one the builder sets but that set the same thing.
_ALIASES = MappingProxyType({"--model": "--model-path"})


@dataclass(frozen=True, repr=False)
class ServerCommand:
    """One server's process: what to run, where it logs, and the secret file it reads.

    `argv` never contains the key; `key_file` is written from `api_key` just before start.
    """

    index: int
    gpu: int | None  # None: a CPU server
    host: str
    port: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    pid_path: Path
    key_file: Path
    api_key: SecretStr = field(compare=False)

    @property
    def name(self) -> str:
        return f"server-{self.index}"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __repr__(self) -> str:
        return f"ServerCommand({self.name}, gpu={self.gpu}, port={self.port}, argv={self.argv})"

    __str__ = __repr__


def _flag_name(arg: str) -> str:
    name = arg.split("=", 1)[0]
    return _ALIASES.get(name, name)


def program(engine: EngineConfig) -> list[str]:
    if engine.kind == "emulator":
        return [engine.python, "-m", "regen.emulator"]
    if engine.launcher == "serve":
        return [str(Path(engine.python).parent / "sglang"), "serve"]
    return [engine.python, "-m", "sglang.launch_server"]


def _sglang_flags(config: RegenConfig, model_path: Path, port: int, key_file: Path) -> list[str]:
    """The flags shared by SGLang and the emulator, in the order of SGLANG_API.md."""
    engine = config.engine
    flags = [
        "--model-path", str(model_path),
        "--served-model-name", config.model.served_name,
        "--host", engine.host,
        "--port", str(port),
        "--config", str(key_file),
    ]  # fmt: skip
    if engine.reasoning_parser:
        flags += ["--reasoning-parser", engine.reasoning_parser]
    if engine.tool_call_parser:
        flags += ["--tool-call-parser", engine.tool_call_parser]
    spec = engine.speculative
    if spec.enabled:
        flags += [
            "--speculative-algorithm", spec.algorithm,
            "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk),
            "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        ]  # fmt: skip
        if spec.draft_model_path is not None:
            flags += ["--speculative-draft-model-path", str(spec.draft_model_path)]
    if engine.device == "cpu":
        flags += CPU_FLAGS
    if engine.deterministic:
        flags += [DETERMINISTIC_FLAG]
    if engine.max_total_tokens is not None:
        flags += ["--max-total-tokens", str(engine.max_total_tokens)]
    # Explicit with speculative decoding on, which 0.5.23 otherwise silently forces to 48.
    if engine.launch_max_running is not None:
        flags += ["--max-running-requests", str(engine.launch_max_running)]
    flags += [
        "--context-length", str(engine.context_length),
        "--mem-fraction-static", str(engine.mem_fraction_static),
        "--enable-metrics",
        "--log-level", "info",
    ]  # fmt: skip
    return flags


def _emulator_flags(emu: EmulatorConfig, index: int) -> list[str]:
    gpu = emu.server_gpus.get(index)
    own = gpu.model_dump(exclude_none=True) if gpu is not None else {}
    curve = {
        k: own.get(k, getattr(emu, k))
        for k in ("tokens_per_s", "batch_knee", "kv_tokens", "prefill_tokens_per_s")
    }
    flags = [
        "--emu-load-s", str(emu.load_s),
        "--emu-tokens-per-s", str(curve["tokens_per_s"]),
        "--emu-batch-knee", str(curve["batch_knee"]),
        "--emu-kv-tokens", str(curve["kv_tokens"]),
        "--emu-prefill-tokens-per-s", str(curve["prefill_tokens_per_s"]),
        "--emu-accept-length", str(emu.accept_length),
        "--emu-time-scale", str(emu.time_scale),
        "--emu-seed", str(emu.seed),
        "--emu-reasoning-tokens", emu.reasoning_tokens,
        "--emu-answer-tokens", emu.answer_tokens,
    ]  # fmt: skip
    for spec in [*emu.faults, *emu.server_faults.get(index, [])]:
        flags += ["--emu-fault", spec]
    return flags


def _all_flags() -> set[str]:
    from regen.sglang_api.flags import sglang_flags

    return {option for flag in sglang_flags() for option in flag["options"]}


def check_extra_args(extra_args: list[str], builder_flags: set[str]) -> None:
    """Refuse what would fail on the GPU node or silently override a setting regen owns."""
    for i, arg in enumerate(extra_args):
        if not arg.startswith("--"):
            continue
        name = _flag_name(arg)
        where = f"engine.extra_args[{i}]"
        if name in REMOVED_FLAGS:
            raise ConfigError(
                f"{where}: {name} was removed in sglang 0.5.23; use {REMOVED_FLAGS[name]}"
            )
        # argparse takes a unique prefix for the whole flag: it would override regen's value.
        owned = [f for f in builder_flags if f.startswith(name) and f != name]
        if owned and name not in _all_flags():
            raise ConfigError(
                f"{where}: {name} abbreviates {owned[0]}, which regen sets from the config; "
                "remove it from engine.extra_args"
            )
        if name == DETERMINISTIC_FLAG:
            raise ConfigError(
                f"{where}: {name} is engine.deterministic: true (regen then knows a hedged "
                "copy is the same draw); remove it from engine.extra_args"
            )
        if name in builder_flags or name == "--api-key":
            raise ConfigError(
                f"{where}: {name} is set by regen from the config; remove it from engine.extra_args"
            )
        if name in DEPRECATED_FLAGS:
            log.warning("engine.extra_args: %s is deprecated in sglang 0.5.23", name)


RUNS_DIR = "runs"
"""Under the work dir: one directory per run, so two runs from one checkout share no file."""


def run_dir(work_dir: Path, run_id: str) -> Path:
    """A run's private directory (`secrets/`, `pids/`, `logs/` of its servers): two runs from
    one checkout (two models on one node) once shared `secrets/server-1.yaml` and broke each
    other with a wrong-key 401 and a missing config file."""
    return Path(work_dir) / RUNS_DIR / run_id


def build_server_commands(
    config: RegenConfig,
    model_path: Path,
    api_key: SecretStr,
    work_dir: Path,
    run_id: str | None = None,
) -> list[ServerCommand]:
    """One command per GPU (or per CPU server) on base_port + i; the emulator gets the same
    flags plus `--emu-*`. With `run_id` the servers' files go under `run_dir`, else under
    `work_dir` itself."""
    engine = config.engine
    if engine.kind == "external":
        raise ConfigError("engine.kind external: regen attaches to engine.urls, it launches none")
    if api_key.get_secret_value().startswith("-"):
        raise ConfigError("engine.api_key: must not start with '-' (SGLang would read a flag)")
    work_dir = run_dir(work_dir, run_id) if run_id else Path(work_dir)
    commands = []
    for index, gpu in enumerate(engine.slots):
        port = engine.base_port + index
        key_file = work_dir / "secrets" / f"server-{index}.yaml"
        flags = _sglang_flags(config, model_path, port, key_file)
        if index == 0:
            # --max-running-requests is regen's even where SGLang sizes it (no flag passed).
            owned = {f for f in flags if f.startswith("--")} | {"--max-running-requests"}
            check_extra_args(engine.extra_args, owned)
        argv = [*program(engine), *flags, *engine.extra_args]
        if engine.kind == "emulator":
            argv += _emulator_flags(engine.emulator, index)
        commands.append(
            ServerCommand(
                index=index,
                gpu=gpu,
                host=engine.host,
                port=port,
                argv=argv,
                env=dict(CPU_ENV) if gpu is None else {"CUDA_VISIBLE_DEVICES": str(gpu)},
                log_path=work_dir / "logs" / f"server-{index}.log",
                pid_path=work_dir / "pids" / f"server-{index}.json",
                key_file=key_file,
                api_key=api_key,
            )
        )
    return commands
