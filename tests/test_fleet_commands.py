"""Golden tests of the launch commands: exactly the SGLang 0.5.23 flags, no key in argv."""

from __future__ import annotations

import logging
import stat
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from regen.errors import ConfigError
from regen.fleet import build_server_commands, generate_api_key
from regen.fleet.commands import ServerCommand
from regen.fleet.process import write_private
from tests.support.fleet import SERVED, fleet_config

KEY = SecretStr("k3y-NOT-IN-ARGV")
STAGED = Path("/dev/shm/regen-models/qwen3-emu")
PY = sys.executable


def _build(tmp_path: Path, servers: int = 2, **engine: object) -> list[ServerCommand]:
    config = fleet_config(tmp_path, servers, kind="sglang", engine=dict(engine))
    return build_server_commands(config, STAGED, KEY, tmp_path / "w")


def _common(port: int, key_file: Path) -> list[str]:
    return [
        "--model-path", str(STAGED),
        "--served-model-name", SERVED,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--config", str(key_file),
        "--reasoning-parser", "qwen3",
    ]  # fmt: skip


# With speculative decoding and no engine.max_running_requests, explicit: 0.5.23 silently
# forces 48 otherwise (speculative_hook.py); SGLang still caps it at half its KV pool.
TAIL = [
    "--max-running-requests", "4096",
    "--context-length", "40960",
    "--mem-fraction-static", "0.88",
    "--enable-metrics",
    "--log-level", "info",
]  # fmt: skip
MTP = [
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]  # fmt: skip


def test_sglang_with_mtp_is_exactly_the_documented_command(tmp_path: Path) -> None:
    commands = _build(tmp_path, servers=2)
    base = commands[0].port
    for i, cmd in enumerate(commands):
        key_file = tmp_path / "w" / "secrets" / f"server-{i}.yaml"
        assert cmd.argv == [
            PY, "-m", "sglang.launch_server", *_common(base + i, key_file), *MTP, *TAIL
        ]  # fmt: skip
        assert cmd.env == {"CUDA_VISIBLE_DEVICES": str(i)}
        assert (cmd.index, cmd.gpu, cmd.port) == (i, i, base + i)
        assert cmd.log_path == tmp_path / "w" / "logs" / f"server-{i}.log"
        assert cmd.pid_path == tmp_path / "w" / "pids" / f"server-{i}.json"
        assert cmd.url == f"http://127.0.0.1:{base + i}"


def test_mtp_off_drops_speculative_flags_but_keeps_max_running_explicit(tmp_path: Path) -> None:
    (cmd,) = _build(tmp_path, servers=1, speculative={"enabled": False}, max_running_requests=48)
    assert not [a for a in cmd.argv if a.startswith("--speculative")]
    at = cmd.argv.index("--max-running-requests")
    assert cmd.argv[at + 1] == "48"


def test_mtp_off_and_no_cap_lets_sglang_size_max_running(tmp_path: Path) -> None:
    (cmd,) = _build(tmp_path, servers=1, speculative={"enabled": False})
    assert "--max-running-requests" not in cmd.argv
    with pytest.raises(ConfigError, match="--max-running-requests is set by regen"):
        _build(tmp_path, servers=1, speculative={"enabled": False},
               extra_args=["--max-running-requests", "8"])  # fmt: skip


def test_draft_model_path_and_no_reasoning_parser(tmp_path: Path) -> None:
    (cmd,) = _build(
        tmp_path,
        servers=1,
        reasoning_parser=None,
        speculative={"algorithm": "EAGLE3", "draft_model_path": "/models/draft"},
    )
    assert "--reasoning-parser" not in cmd.argv
    at = cmd.argv.index("--speculative-algorithm")
    assert cmd.argv[at : at + 10] == [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
        "--speculative-draft-model-path", "/models/draft",
    ]  # fmt: skip


def test_serve_launcher_uses_the_venv_sglang_script(tmp_path: Path) -> None:
    (cmd,) = _build(tmp_path, servers=1, launcher="serve", python="/opt/venv/bin/python")
    assert cmd.argv[:3] == ["/opt/venv/bin/sglang", "serve", "--model-path"]


def test_extra_args_come_last(tmp_path: Path) -> None:
    extra = ["--cuda-graph-max-bs-decode", "64", "--watchdog-timeout", "600"]
    (cmd,) = _build(tmp_path, servers=1, extra_args=extra)
    assert cmd.argv[-len(extra) :] == extra
    assert cmd.argv[-len(extra) - len(TAIL) : -len(extra)] == TAIL


@pytest.mark.parametrize("flag", ["--cuda-graph-max-bs", "--cuda-graph-max-bs=32"])
def test_removed_flag_is_rejected_naming_its_replacement(tmp_path: Path, flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        _build(tmp_path, servers=1, extra_args=[flag, "32"] if "=" not in flag else [flag])
    message = str(err.value)
    assert "engine.extra_args[0]: --cuda-graph-max-bs" in message
    assert "--cuda-graph-max-bs-decode" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--port", "1"], "--port"),
        (["--max-running-requests=8"], "--max-running-requests"),
        (["--model", "/x"], "--model-path"),
        (["--api-key", "x"], "--api-key"),
        (["--config", "x.yaml"], "--config"),
        (["--enable-metrics"], "--enable-metrics"),
        # argparse takes a unique prefix for the whole flag, overriding regen's value.
        (["--mem-fraction", "0.5"], "--mem-fraction abbreviates --mem-fraction-static"),
        (["--context-len=8"], "--context-len abbreviates --context-length"),
    ],
)
def test_flag_the_builder_sets_is_rejected(tmp_path: Path, extra: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=r"engine\.extra_args") as err:
        _build(tmp_path, servers=1, extra_args=extra)
    assert named in str(err.value)


def test_deprecated_flag_warns_but_passes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="regen.fleet.commands"):
        (cmd,) = _build(tmp_path, servers=1, extra_args=["--disable-cuda-graph"])
    assert cmd.argv[-1] == "--disable-cuda-graph"
    assert "--disable-cuda-graph is deprecated" in caplog.text


def test_key_is_in_no_argv_env_or_repr(tmp_path: Path) -> None:
    secret = KEY.get_secret_value()
    for kind in ("sglang", "emulator"):
        config = fleet_config(tmp_path, 2, kind=kind)
        for cmd in build_server_commands(config, STAGED, KEY, tmp_path / "w"):
            assert not any(secret in a for a in cmd.argv)
            assert "--api-key" not in cmd.argv
            assert secret not in repr(cmd) and secret not in str(cmd)
            assert not any(secret in v for v in cmd.env.values())
            assert cmd.api_key.get_secret_value() == secret  # written to key_file at launch


def test_emulator_gets_the_same_flags_plus_emu_flags(tmp_path: Path) -> None:
    engine = {
        "extra_args": ["--cuda-graph-max-bs-decode", "8"],
        "emulator": {
            "load_s": 2,
            "tokens_per_s": 100,
            "time_scale": 0.5,
            "seed": 7,
            "reasoning_tokens": "10:20",
            "answer_tokens": "1:2",
            "faults": ["http500=0.1"],
            "server_faults": {1: ["slow=0.25", "crash-after=3"]},
            # A mixed fleet: server 1 another GPU (its own knee and KV pool).
            "server_gpus": {1: {"batch_knee": 48, "kv_tokens": 50_000}},
        },
    }
    config = fleet_config(tmp_path, 2, kind="sglang", engine=engine)
    sglang = build_server_commands(config, STAGED, KEY, tmp_path)
    as_emulator = config.engine.model_copy(update={"kind": "emulator"})
    emulated = build_server_commands(
        config.model_copy(update={"engine": as_emulator}), STAGED, KEY, tmp_path
    )
    def emu_common(knee: str, kv: str) -> list[str]:
        return [
            "--emu-load-s", "2.0", "--emu-tokens-per-s", "100.0", "--emu-batch-knee", knee,
            "--emu-kv-tokens", kv, "--emu-prefill-tokens-per-s", "10000.0",
            "--emu-accept-length", "3.6", "--emu-time-scale", "0.5",
            "--emu-seed", "7", "--emu-reasoning-tokens", "10:20", "--emu-answer-tokens", "1:2",
            "--emu-fault", "http500=0.1",
        ]  # fmt: skip

    for s, e in zip(sglang, emulated, strict=True):
        assert e.argv[:3] == [PY, "-m", "regen.emulator"]
        n = len(s.argv) - 3
        assert e.argv[3 : 3 + n] == s.argv[3:]
        assert e.env == s.env
    assert emulated[0].argv[3 + n :] == emu_common("128", "400000")
    assert emulated[1].argv[3 + n :] == [
        *emu_common("48", "50000"), "--emu-fault", "slow=0.25", "--emu-fault", "crash-after=3"
    ]  # fmt: skip


def test_external_kind_launches_nothing(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 1, kind="external", engine={"urls": ["http://127.0.0.1:30000"]})
    with pytest.raises(ConfigError, match="external"):
        build_server_commands(config, STAGED, KEY, tmp_path)


def test_a_key_argparse_would_read_as_a_flag_is_refused(tmp_path: Path) -> None:
    config = fleet_config(tmp_path, 1, kind="sglang")
    with pytest.raises(ConfigError, match=r"engine\.api_key"):
        build_server_commands(config, STAGED, SecretStr("-abc"), tmp_path)


def test_generated_keys_are_long_and_fresh() -> None:
    keys = {generate_api_key().get_secret_value() for _ in range(20)}
    assert len(keys) == 20
    assert all(len(k) >= 40 and not k.startswith("-") for k in keys)
    assert "**" in repr(generate_api_key())


def test_key_file_is_private_yaml(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "server-0.yaml"
    write_private(path, b"api-key: x\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
