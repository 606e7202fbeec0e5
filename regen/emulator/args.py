"""Launch flags: SGLang 0.5.23's own set, parsed the way `sglang serve` parses them, plus `--emu-*`.

The flag set is vendored from the real parser (regen.sglang_api.flags, the owner of SGLang's
wire facts; tests/contract checks it still equals sglang's), so an unknown
flag, a removed one or a value of the wrong type exits 2 here exactly as it kills a real server
at launch: a rehearsal fails the way the GPU fleet would. argparse abbreviations stay on, like
SGLang, so `--cuda-graph-max-bs` is "ambiguous ... could match --cuda-graph-max-bs-decode,
--cuda-graph-max-bs-prefill". `--config FILE.yaml` is merged as SGLang does (file values first,
the command line wins), the only way 0.5.23 offers to keep `--api-key` out of `ps`: it reads
no API-key environment variable.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from regen.emulator.faults import Faults, parse_faults
from regen.emulator.gpu import (
    DEFAULT_KNEE,
    DEFAULT_KV_TOKENS,
    DEFAULT_TOKENS_PER_S,
    capped_max_running,
    sglang_max_running,
)
from regen.sglang_api.flags import sglang_flags

DEFAULT_CONTEXT_LENGTH = 40960
# A 27B model's prefill on one H100-class GPU is of the order of 10K tokens/s; a cache miss on a
# long conversation then costs its history / 10K seconds of the server's prefill.
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
SPECULATIVE_MAX_RUNNING = 48  # what 0.5.23 forces with speculative decoding and no flag
# SGLang's own defaults of the flags the emulator reads; the vendored list keeps only shapes.
_DEFAULTS = {"host": "127.0.0.1", "port": 30000, "log_level": "info"}
_RANGE = re.compile(r"^(\d+):(\d+)$")
_HUMAN_INT = re.compile(r"^(?:(\d+(?:\.\d+)?)([kMGT])|(\d+)(Ki|Mi|Gi|Ti)?)$")
_SCALE = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20}
_SCALE |= {"Gi": 2**30, "Ti": 2**40}


def human_readable_int(value: str) -> int:
    """sglang's own type of --max-total-tokens and kin: 1k, 25.6k, 1Mi, same words on error."""
    found = _HUMAN_INT.match(value.strip())
    if not found:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: {value!r}. Use a plain integer, SI suffixes (1k, 1M), "
            "or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
        )
    number, si, whole, iec = found.groups()
    if si:
        return int(float(number) * _SCALE[si])
    return int(whole) * _SCALE.get(iec or "", 1)


def json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


# The vendored type names; sglang's other custom types take any string argparse gives them.
_TYPES: dict[str | None, Any] = {
    "int": int, "float": float, "str": str, "json": json.loads,
    "human_readable_int": human_readable_int, "json_list_type": json_list_type,
}  # fmt: skip


@dataclass(frozen=True)
class EmuArgs:
    """Everything the emulator needs from its command line."""

    model_path: str
    served_model_name: str
    host: str
    port: int
    api_key: str | None
    reasoning_parser: str | None
    speculative_algorithm: str | None
    max_running_requests: int | None  # as resolved at launch: None lets the KV pool size it
    max_queued_requests: int | None
    context_length: int | None  # None: the model's config.json decides
    enable_metrics: bool
    log_level: str
    skip_server_warmup: bool
    load_s: float
    tokens_per_s: float
    time_scale: float
    prefill_tokens_per_s: float
    batch_knee: int | None  # None: no knee, the linear model
    gpu_kv_tokens: int  # the KV pool the emulated GPU has room for
    seed: int
    accept_length: float
    reasoning_tokens: tuple[int, int]
    answer_tokens: tuple[int, int]
    faults: Faults
    # The launch arguments as SGLang names them, for /server_info.
    server_args: dict[str, Any] = field(default_factory=dict)

    def kv_tokens(self) -> int:
        """The KV pool in tokens (max_total_num_tokens): the GPU's room, or less where
        --max-total-tokens asks for less, as SGLang takes the smaller of the two."""
        asked = self.server_args.get("max_total_tokens")
        return min(self.gpu_kv_tokens, asked) if asked else self.gpu_kv_tokens

    def effective_max_running(self, context_length: int) -> int:
        """max_running_requests as SGLang resolves it: the flag (or 48 with speculative
        decoding) capped at half the pool, else its own sizing from the pool."""
        kv = self.kv_tokens()
        if self.max_running_requests is not None:
            return capped_max_running(self.max_running_requests, kv)
        return sglang_max_running(kv, context_length)


def _range(text: str) -> tuple[int, int]:
    found = _RANGE.match(text)
    if not found or int(found.group(1)) > int(found.group(2)):
        raise argparse.ArgumentTypeError(f"expected MIN:MAX with MIN <= MAX, got {text!r}")
    return int(found.group(1)), int(found.group(2))


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _add_sglang_flag(p: argparse.ArgumentParser, flag: dict[str, Any]) -> None:
    options, dest = flag["options"], flag["dest"]
    common: dict[str, Any] = {"dest": dest, "help": argparse.SUPPRESS}
    kind, nargs = flag["kind"], flag["nargs"]
    if kind in ("store_true", "store_false"):
        p.add_argument(*options, action=kind, **common)
    elif kind == "boolean_optional":
        p.add_argument(*options, action=argparse.BooleanOptionalAction, **common)
    elif kind == "store_const" or nargs == 0:  # SGLang's Deprecated* actions take no value
        p.add_argument(*options, action="store_const", const=flag["const"], **common)
    else:
        if nargs is not None:
            common["nargs"] = nargs
        if flag["choices"]:
            common["choices"] = flag["choices"]
        if flag["type"]:
            common["type"] = _TYPES.get(flag["type"], str)
        action = "append" if kind == "append" else "store"
        p.add_argument(*options, action=action, required=flag["required"], **common)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="regen emulator",
        description="An SGLang 0.5.23 compatible server that emulates a model on a CPU.",
    )
    for flag in sglang_flags():
        _add_sglang_flag(p, flag)
    p.set_defaults(**_DEFAULTS)
    emu = p.add_argument_group("emulator")
    emu.add_argument("--emu-load-s", type=float, default=0.5, help="Simulated load time.")
    emu.add_argument(
        "--emu-tokens-per-s",
        type=_positive,
        default=DEFAULT_TOKENS_PER_S,
        help="A lone request's decode speed (simulated tokens/s).",
    )
    emu.add_argument(
        "--emu-batch-knee",
        type=int,
        default=DEFAULT_KNEE,
        help="Running requests past which a decode step slows with the batch (0: never, "
        "every request at --emu-tokens-per-s however many run).",
    )
    emu.add_argument(
        "--emu-kv-tokens",
        type=human_readable_int,
        default=DEFAULT_KV_TOKENS,
        help="The KV pool the emulated GPU has room for, in tokens (--max-total-tokens "
        "can only lower it).",
    )
    emu.add_argument(
        "--emu-prefill-tokens-per-s",
        type=_positive,
        default=DEFAULT_PREFILL_TOKENS_PER_S,
        help="Simulated prefill rate of the server (uncached prompt tokens/s, one at a time).",
    )
    emu.add_argument(
        "--emu-time-scale", type=_positive, default=1.0, help="Wall s per simulated s."
    )
    emu.add_argument("--emu-seed", type=int, default=0)
    emu.add_argument("--emu-accept-length", type=_positive, default=3.6)
    emu.add_argument("--emu-reasoning-tokens", type=_range, default=(200, 4000))
    emu.add_argument("--emu-answer-tokens", type=_range, default=(20, 800))
    emu.add_argument("--emu-fault", action="append", default=[], metavar="NAME[=VALUE]")
    return p


def _merge_config(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """SGLang's `--config`: YAML keys become flags placed before the command line's."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at == len(argv) - 1:
        parser.error("No config file specified after --config flag!")
    path = Path(argv[at + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        parser.error(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        parser.error(f"Config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        parser.error("Config file must contain a dictionary at root level")
    switches = {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    merged: list[str] = []
    for key, value in data.items():
        flag = f"--{str(key).replace('_', '-')}"
        if isinstance(value, bool) and str(key).replace("-", "_") in switches:
            merged += [flag] if value else []
        elif isinstance(value, list):
            for item in value:  # repeatable flags such as --emu-fault
                merged += [flag, str(item)]
        else:
            merged += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return merged + argv[:at] + argv[at + 2 :]


def parse_args(argv: list[str]) -> EmuArgs:
    """Parse like SGLang; argparse errors exit 2 with SGLang's wording."""
    parser = _parser()
    argv = _merge_config(parser, argv)
    ns = parser.parse_args(argv)
    try:
        faults = parse_faults(ns.emu_fault)
    except ValueError as err:
        parser.error(str(err))
    if ns.emu_load_s < 0:
        parser.error("--emu-load-s must be >= 0")
    running = ns.max_running_requests
    if running is None and ns.speculative_algorithm:
        running = SPECULATIVE_MAX_RUNNING
    if running is not None and running < 1:
        parser.error("--max-running-requests must be >= 1")
    if ns.emu_batch_knee < 0:
        parser.error("--emu-batch-knee must be >= 0")
    if ns.emu_kv_tokens < 1:
        parser.error("--emu-kv-tokens must be >= 1")
    if not isinstance(getattr(logging, ns.log_level.upper(), None), int):
        parser.error(f"--log-level: unknown level {ns.log_level!r}")
    served = ns.served_model_name or ns.model_path
    server_args = {
        k: v for k, v in vars(ns).items() if not k.startswith("emu_") and k not in ("config",)
    }
    server_args.update(served_model_name=served, max_running_requests=running)
    return EmuArgs(
        model_path=ns.model_path,
        served_model_name=served,
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key,
        reasoning_parser=ns.reasoning_parser,
        speculative_algorithm=ns.speculative_algorithm,
        max_running_requests=running,
        max_queued_requests=ns.max_queued_requests,
        context_length=ns.context_length,
        enable_metrics=ns.enable_metrics,
        log_level=ns.log_level,
        skip_server_warmup=ns.skip_server_warmup,
        load_s=ns.emu_load_s,
        tokens_per_s=ns.emu_tokens_per_s,
        time_scale=ns.emu_time_scale,
        prefill_tokens_per_s=ns.emu_prefill_tokens_per_s,
        batch_knee=ns.emu_batch_knee or None,
        gpu_kv_tokens=ns.emu_kv_tokens,
        seed=ns.emu_seed,
        # As 0.5.23 exports it with speculative decoding off.
        accept_length=ns.emu_accept_length if ns.speculative_algorithm else 0.0,
        reasoning_tokens=ns.emu_reasoning_tokens,
        answer_tokens=ns.emu_answer_tokens,
        faults=faults,
        server_args=server_args,
    )
