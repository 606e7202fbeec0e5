"""Each exact launch argv through SGLang's own parser before any server starts.

A flag the real server refuses (a typo, a removed flag, a value of the wrong type) makes
argparse exit 2 at launch, seconds after the GPUs are paid for. Here the same argv is parsed
first: by `prepare_server_args` inside `engine.python` when that interpreter has sglang
(`argcheck.py`, run by path: it needs no regen), else by the emulator's parser, which holds
0.5.23's vendored flag set. A refusal names the flag and the config key it came from.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from regen.config import EngineConfig
from regen.fleet.commands import ServerCommand, program

ARGCHECK = Path(__file__).with_name("argcheck.py")
# Where each flag the builder writes comes from, for the message that names it.
_CONFIG_KEYS = {
    "--model-path": "model.source",
    "--served-model-name": "model.served_name",
    "--host": "engine.host",
    "--port": "engine.base_port",
    "--config": "engine.api_key",
    "--reasoning-parser": "engine.reasoning_parser",
    "--tool-call-parser": "engine.tool_call_parser",
    "--max-running-requests": "engine.max_running_requests",
    "--context-length": "engine.context_length",
    "--mem-fraction-static": "engine.mem_fraction_static",
    "--speculative-algorithm": "engine.speculative.algorithm",
    "--speculative-num-steps": "engine.speculative.num_steps",
    "--speculative-eagle-topk": "engine.speculative.eagle_topk",
    "--speculative-num-draft-tokens": "engine.speculative.num_draft_tokens",
    "--speculative-draft-model-path": "engine.speculative.draft_model_path",
}
_FLAG = re.compile(r"--[A-Za-z0-9][\w-]*")
_PREFIX = re.compile(r"^[\w ./-]*: error: ")


@dataclass(frozen=True)
class FlagVerdict:
    """What parsed the argvs (`judge`) and the first refusal, if any, in the user's terms."""

    judge: str
    problem: str | None


def _config_key(flag: str, extra_args: list[str]) -> str:
    for i, arg in enumerate(extra_args):
        if arg == flag or arg.startswith(f"{flag}="):
            return f"engine.extra_args[{i}]"
    if flag.startswith("--emu-"):
        return "engine.emulator"
    return _CONFIG_KEYS.get(flag, "engine")


def _explain(error: str, extra_args: list[str]) -> str:
    """`engine.extra_args[2]: --cuda-graph-max-bs: ambiguous option: ...` from argparse's line."""
    message = _PREFIX.sub("", error.strip())
    found = _FLAG.search(message)
    if not found:
        return f"engine: {message}"
    flag = found.group(0)
    return f"{_config_key(flag, extra_args)}: {flag}: {message}"


def _flags(commands: list[ServerCommand], engine: EngineConfig, key_file: Path) -> list[list[str]]:
    """The argvs without the program, each reading a placeholder key file that exists now."""
    skip = len(program(engine))
    out = []
    for command in commands:
        argv = command.argv[skip:]
        out.append([str(key_file) if a == str(command.key_file) else a for a in argv])
    return out


def _real_parser(python: str, argvs: list[list[str]], timeout_s: float) -> list[str | None] | None:
    """sglang's verdict per argv from `python`, or None when that interpreter has no sglang."""
    try:
        proc = subprocess.run(
            [python, str(ARGCHECK), "check"],
            input=json.dumps(argvs),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None  # no sglang there (or a broken one): the engine row says which
    return [None if r["ok"] else str(r["error"]) for r in json.loads(proc.stdout)]


def _emulator_parser(argvs: list[list[str]]) -> list[str | None]:
    from regen.emulator.args import parse_args

    verdicts: list[str | None] = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parse_args(argv)
        except SystemExit:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            verdicts.append(lines[-1] if lines else "refused")
            continue
        verdicts.append(None)
    return verdicts


def check_argvs(
    commands: list[ServerCommand], engine: EngineConfig, timeout_s: float = 120.0
) -> FlagVerdict:
    """Parse every launch argv as the server will, launching nothing."""
    with tempfile.TemporaryDirectory(prefix="regen-flags-") as tmp:
        key_file = Path(tmp) / "key.yaml"
        key_file.write_text("api-key: preflight-placeholder\n")
        argvs = _flags(commands, engine, key_file)
        verdicts = None
        judge = "the emulator's parser (sglang 0.5.23 flags)"
        if engine.kind == "sglang":
            verdicts = _real_parser(engine.python, argvs, timeout_s)
            judge = "sglang's own parser" if verdicts is not None else "vendored 0.5.23 flags"
        if verdicts is None:
            verdicts = _emulator_parser(argvs)
    for verdict in verdicts:
        if verdict is not None:
            return FlagVerdict(judge, _explain(verdict, engine.extra_args))
    return FlagVerdict(judge, None)
