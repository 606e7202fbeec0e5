"""Each exact launch argv through SGLang's own parser before any server starts.

A flag the real server refuses (a typo, a removed flag, a value of the wrong type) makes
argparse exit 2 at launch, seconds after the GPUs are paid for. Here the same argv is parsed
first: by `prepare_server_args` inside `engine.python` when that interpreter has sglang
(`argcheck.py`, run by path: it needs no regen), else by the emulator's parser, which holds
0.5.23's vendored flag set. A refusal names the flag and the config key it came from.

Asking `engine.python` costs an import of sglang (10-25 s on a small CPU): `ask_sglang` makes
that one start answer the preflight's engine row too (sglang's version, its import time).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import tempfile
from collections.abc import Iterator
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


@contextlib.contextmanager
def _flags(commands: list[ServerCommand], engine: EngineConfig) -> Iterator[list[list[str]]]:
    """The argvs without the program, each reading a placeholder key file that exists
    meanwhile (the parser reads `--config`)."""
    skip = len(program(engine))
    with tempfile.TemporaryDirectory(prefix="regen-flags-") as tmp:
        key_file = Path(tmp) / "key.yaml"
        key_file.write_text("api-key: preflight-placeholder\n")
        out = []
        for command in commands:
            argv = command.argv[skip:]
            out.append([str(key_file) if a == str(command.key_file) else a for a in argv])
        yield out


@dataclass(frozen=True)
class SglangAnswer:
    """What one start of `engine.python` said: sglang's version and import time and its
    parser's verdict per argv (None: no server parser there), or why it could not answer."""

    version: str | None = None
    import_s: float = 0.0
    verdicts: list[str | None] | None = None
    failure: str | None = None  # the last line it wrote to stderr, or why it did not start
    timed_out: bool = False


def ask_sglang(
    python: str, commands: list[ServerCommand], engine: EngineConfig, timeout_s: float
) -> SglangAnswer:
    """Start `python` once: import sglang, then parse each command's argv with it."""
    with _flags(commands, engine) as argvs:
        try:
            proc = subprocess.run(
                [python, str(ARGCHECK), "probe"],
                input=json.dumps(argvs),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return SglangAnswer(timed_out=True)
        except OSError as err:
            return SglangAnswer(failure=f"{type(err).__name__}: {err}")
    if proc.returncode != 0:  # no sglang there, or a broken one
        return SglangAnswer(failure=(proc.stderr.strip().splitlines() or ["(no output)"])[-1])
    answer = json.loads(proc.stdout)
    results = answer["verdicts"]
    verdicts = None if results is None else [None if r["ok"] else str(r["error"]) for r in results]
    return SglangAnswer(str(answer["version"]), float(answer["import_s"]), verdicts)


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
    commands: list[ServerCommand],
    engine: EngineConfig,
    timeout_s: float = 120.0,
    answer: SglangAnswer | None = None,
) -> FlagVerdict:
    """Parse every launch argv as the server will, launching nothing; `answer` is what
    `ask_sglang` already said of these commands (asked here when None)."""
    verdicts = None
    judge = "the emulator's parser (sglang 0.5.23 flags)"
    if engine.kind == "sglang":
        answer = answer or ask_sglang(engine.python, commands, engine, timeout_s)
        verdicts = answer.verdicts
        judge = "sglang's own parser" if verdicts is not None else "vendored 0.5.23 flags"
    if verdicts is None:
        with _flags(commands, engine) as argvs:
            verdicts = _emulator_parser(argvs)
    for verdict in verdicts:
        if verdict is not None:
            return FlagVerdict(judge, _explain(verdict, engine.extra_args))
    return FlagVerdict(judge, None)
