"""Launch flags, judged by sglang 0.5.23's own parser: ours parse to what we meant, and a
mistaken flag is refused by the real parser, the emulator and `regen check` alike."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from regen.config import RegenConfig
from regen.fleet import build_server_commands
from regen.fleet.commands import ServerCommand, program
from regen.preflight import check_flags
from regen.sglang_api.flags import FLAGS_FILE
from tests.contract._sglang import SGLANG_PYTHON, Sglang
from tests.support.fleet import MODEL_DIR, SERVED, fleet_config

KEY = SecretStr("contract-key-0c4e")

# Held out from the code that judges them: typos, a removed flag, flags that never existed
# in 0.5.23, values of the wrong type. Each must fail before any server starts.
MISTAKES: list[tuple[list[str], str]] = [
    (["--cuda-graph-max-bs", "64"], "--cuda-graph-max-bs"),  # removed: now ambiguous
    (["--stream-output"], "--stream-output"),  # never in 0.5.23
    (["--max-runing-requests", "8"], "--max-runing-requests"),  # typo
    (["--tensor-paralel-size", "2"], "--tensor-paralel-size"),  # typo
    (["--enable-mixed-chunks"], "--enable-mixed-chunks"),  # typo
    (["--tp-size", "two"], "--tp-size"),  # wrong type
    (["--max-total-tokens", "lots"], "--max-total-tokens"),  # sglang's own int type
    (["--watchdog-timeout", "ten"], "--watchdog-timeout"),  # wrong type
    (["--schedule-policy", "fastest"], "--schedule-policy"),  # not one of the choices
    (["--trust-remote-code=yes"], "--trust-remote-code"),  # a switch takes no value
]


def _flags_of(config: RegenConfig, command: ServerCommand) -> list[str]:
    """The argv without the program; the emulator's own `--emu-*` flags left out."""
    out: list[str] = []
    skip = False
    for arg in command.argv[len(program(config.engine)) :]:
        if skip:
            skip = False
        elif arg.startswith("--emu-"):
            skip = True
        else:
            out.append(arg)
    return out


def _commands(tmp_path: Path, kind: str, **engine: Any) -> tuple[RegenConfig, list[ServerCommand]]:
    config = fleet_config(tmp_path, 2, kind=kind, engine=engine)
    commands = build_server_commands(config, MODEL_DIR, KEY, tmp_path / "w")
    for command in commands:  # as ServerProcess.start writes it
        command.key_file.parent.mkdir(parents=True, exist_ok=True)
        command.key_file.write_text(f"api-key: {KEY.get_secret_value()}\n")
    return config, commands


def test_vendored_flag_list_is_sglangs(sglang: Sglang) -> None:
    """The emulator refuses exactly what 0.5.23 refuses only while its list is sglang's."""
    assert json.loads(FLAGS_FILE.read_text()) == sglang.ask("flags")


@pytest.mark.parametrize(
    ("kind", "engine"),
    [
        ("sglang", {}),
        (
            "sglang",
            {"speculative": {"enabled": False}, "extra_args": ["--watchdog-timeout", "600"]},
        ),
        ("sglang", {"reasoning_parser": None, "max_running_requests": 32, "context_length": 8192}),
        ("sglang", {"deterministic": True}),
        ("emulator", {}),
    ],
)
def test_builder_argvs_parse_to_what_we_meant(
    sglang: Sglang, tmp_path: Path, kind: str, engine: dict[str, Any]
) -> None:
    config, commands = _commands(tmp_path, kind, **engine)
    for command in commands:
        verdict = sglang.ask("argv", argv=_flags_of(config, command))
        assert verdict["ok"], verdict
        got = verdict["values"]
        e = config.engine
        meant = {
            "model_path": str(MODEL_DIR),
            "served_model_name": SERVED,
            "host": "127.0.0.1",
            "port": command.port,
            "api_key": "<set>",  # from the --config file: the key is not in argv
            "reasoning_parser": e.reasoning_parser,
            "max_running_requests": e.launch_max_running,  # None: SGLang sizes it
            "context_length": e.context_length,
            "mem_fraction_static": e.mem_fraction_static,
            "enable_metrics": True,
            "log_level": "info",
            "speculative_algorithm": e.speculative.algorithm if e.speculative.enabled else None,
            "enable_deterministic_inference": e.deterministic,
        }
        if e.speculative.enabled:
            meant |= {
                "speculative_num_steps": e.speculative.num_steps,
                "speculative_eagle_topk": e.speculative.eagle_topk,
                "speculative_num_draft_tokens": e.speculative.num_draft_tokens,
            }
        if "--watchdog-timeout" in e.extra_args:
            meant["watchdog_timeout"] = 600.0
        assert {k: got[k] for k in meant} == meant


@pytest.fixture(scope="module")
def real_verdicts(sglang: Sglang) -> list[dict[str, Any]]:
    argvs = [["--model-path", str(MODEL_DIR), *extra] for extra, _ in MISTAKES]
    return [sglang.ask("argv", argv=argv) for argv in argvs]


def _words(message: str) -> str:
    return re.sub(r"\(choose from .*\)", "(choose from ...)", message)


@pytest.mark.parametrize("case", range(len(MISTAKES)), ids=[m[1] for m in MISTAKES])
def test_mistakes_are_refused_by_sglang_and_by_regen_check(
    real_verdicts: list[dict[str, Any]], tmp_path: Path, case: int
) -> None:
    extra, flag = MISTAKES[case]
    real = real_verdicts[case]
    assert not real["ok"] and real["code"] == 2 and flag in real["error"], real
    # `regen check`'s flags row, for the emulator (the rehearsal) with the same extra_args.
    config = fleet_config(tmp_path, 2, engine={"extra_args": ["--random-seed", "1", *extra]})
    row = check_flags(config)
    assert row.status == "fail", row
    assert row.figure.startswith(f"engine.extra_args[2]: {flag}"), row.figure
    if row.hint.startswith("refused by"):  # else regen's own check, with a better hint
        # The parser's own words (its choices listed in its own, set-made order).
        assert _words(real["error"].split("error: ", 1)[1]) in _words(row.figure)


def test_abbreviating_a_flag_regen_sets_is_refused(sglang: Sglang, tmp_path: Path) -> None:
    """sglang takes `--mem-fraction` for --mem-fraction-static, silently overriding the config."""
    real = sglang.ask("argv", argv=["--model-path", "m", "--mem-fraction", "0.5"])
    assert real["ok"] and real["values"]["mem_fraction_static"] == 0.5
    row = check_flags(fleet_config(tmp_path, 1, engine={"extra_args": ["--mem-fraction", "0.5"]}))
    assert row.status == "fail"
    assert row.figure.startswith("engine.extra_args[0]: --mem-fraction abbreviates"), row.figure


def test_regen_check_asks_the_real_parser_in_engine_python(tmp_path: Path) -> None:
    """engine.python has sglang: the flags row is the real parser's verdict, naming the key."""
    engine = {
        "python": str(SGLANG_PYTHON),
        "extra_args": ["--watchdog-timeout", "60", "--max-runing-requests", "8"],
    }
    row = check_flags(fleet_config(tmp_path, 2, kind="sglang", engine=engine))
    assert row.status == "fail" and "sglang's own parser" in row.hint, row
    assert row.figure == (
        "engine.extra_args[2]: --max-runing-requests: unrecognized arguments: "
        "--max-runing-requests 8"
    ), row.figure
