"""Rehearsals never touch the GPU run's output and judge its config first; the guards and exit
codes of the other verbs (issue 30). Through the real CLI: `main()` where nothing but the
command line is judged, a subprocess where the process's environment or a flow is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.cli import main
from regen.errors import ConfigError
from regen.machine.ports import quiet_port_range
from regen.rehearsal import bundled, plan_rehearsal
from support.s3 import MotoS3
from tests.support.audit import make_dataset
from tests.support.cli import regen_env as _regen_env
from tests.support.cli import run_regen

pytestmark = pytest.mark.timeout(480)

# The README's node.yaml: a real model, sglang in its own venv, a 2-GPU node, output on S3.
NODE = {
    "model": {"source": "/nonexistent/Qwen3.6-27B", "served_name": "qwen3.6-27b"},
    "engine": {"kind": "sglang", "python": "/opt/sglang-venv/bin/python", "gpus": [0, 1]},
}


def _node(path: Path, output: str, **changes: Any) -> Path:
    data = {**json.loads(json.dumps(NODE)), "output": output, "prompts": "prompts.jsonl"}
    for key, value in changes.items():
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = value
    path.write_text(yaml.safe_dump(data))
    return path


def _prompts(path: Path, n: int = 6) -> None:
    rows = (
        json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q {i}"}]})
        for i in range(n)
    )
    path.write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def s3_rehearsal(
    tmp_path_factory: pytest.TempPathFactory, prefect_home: Path, moto_s3: MotoS3
) -> dict[str, Any]:
    """`regen rehearse --config node.yaml` whose output is an S3 prefix, as a user runs it."""
    work = tmp_path_factory.mktemp("s3-rehearsal")
    moto = moto_s3  # the worker's one server (tests/conftest.py); the bucket is this test's
    bucket = moto.create_bucket()
    _prompts(work / "prompts.jsonl")
    config = _node(work / "node.yaml", f"s3://{bucket}/regen/qwen3.6-27b")
    env = {**_regen_env(prefect_home), **moto.env}
    args = ["rehearse", "--config", str(config), "--servers", "1"]
    proc = run_regen(args, env, cwd=work, timeout=420)  # a loaded CI box: Prefect starts slowly
    keys = [o["Key"] for o in moto.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {"work": work, "proc": proc, "keys": keys, "config": config}


def test_rehearsal_of_an_s3_output_leaves_the_prefix_empty(s3_rehearsal: dict[str, Any]) -> None:
    proc, work = s3_rehearsal["proc"], s3_rehearsal["work"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert s3_rehearsal["keys"] == [], "the rehearsal wrote into the config's output"
    local = work / ".regen" / "rehearsal" / "regen-qwen3-6-27b"
    assert (local / "run.json").is_file() and (local / "report" / "audit.md").is_file()
    assert "rehearsal: writing to .regen/rehearsal/regen-qwen3-6-27b" in proc.stdout
    assert "dataset: .regen/rehearsal/regen-qwen3-6-27b" in proc.stdout


def test_rehearsal_lists_the_gpu_nodes_facts_as_not_checked_here(
    s3_rehearsal: dict[str, Any],
) -> None:
    """A model path this machine does not have is a row, not a failure nor a silence."""
    out = s3_rehearsal["proc"].stdout
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    for name in ("model", "engine", "gpus", "ports", "stage dir", "storage"):
        assert "skipped" in rows[name] and "not checked here" in rows[name], name
    assert "/nonexistent/Qwen3.6-27B" in rows["model"]
    assert "pass" in rows["config"] and "pass" in rows["flags"]


def test_regen_check_notices_a_rehearsals_dataset(
    s3_rehearsal: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GPU run's config pointed at a rehearsal's output fails `regen check`, before the
    run would be refused after staging."""
    model = shutil.copytree(bundled("emulator-model"), tmp_path / "qwen")
    rehearsed = s3_rehearsal["work"] / ".regen" / "rehearsal" / "regen-qwen3-6-27b"
    config = _node(
        tmp_path / "gpu.yaml",
        str(rehearsed),
        **{"model.source": str(model), "engine.kind": "emulator"},
    )
    (tmp_path / "prompts.jsonl").write_text((s3_rehearsal["work"] / "prompts.jsonl").read_text())
    config.write_text(config.read_text().replace("prompts.jsonl", str(tmp_path / "prompts.jsonl")))
    assert main(["check", "--config", str(config)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "holds a rehearsal's dataset, made on emulators" in out


def test_a_config_error_fails_the_rehearsal_as_regen_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = _node(tmp_path / "node.yaml", "out/node", **{"engine.gpus": "0,1"})
    assert main(["check", "--config", str(config)]) == 2
    checked = capsys.readouterr().err.strip().splitlines()
    assert main(["rehearse", "--config", str(config)]) == 2
    rehearsed = capsys.readouterr().err.strip().splitlines()
    assert (
        checked
        == rehearsed
        == [f"regen: error: {config}: engine.gpus: Input should be a valid list"]
    )
    assert not (tmp_path / ".regen").exists() and not (tmp_path / "out").exists()


def test_a_removed_server_flag_fails_the_rehearsal_with_checks_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")  # each row on one line
    _prompts(tmp_path / "prompts.jsonl")
    config = _node(
        tmp_path / "node.yaml", "out/node", **{"engine.extra_args": ["--max-runing-requests", "8"]}
    )
    assert main(["check", "--config", str(config)]) == 1
    checked = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│ flags ")]
    assert main(["rehearse", "--config", str(config)]) == 1
    rehearsed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│ flags ")]
    assert "--max-runing-requests" in checked[0]
    assert [" ".join(r.split()) for r in rehearsed] == [" ".join(c.split()) for c in checked]
    assert not (tmp_path / ".regen").exists(), "the rehearsal started"


def test_rehearsal_outputs(tmp_path: Path) -> None:
    """Derived from the config, one per fault set; --out never the config's output."""
    config = _node(tmp_path / "node.yaml", "s3://b/regen/qwen")
    assert plan_rehearsal(config_path=config).config.output == ".regen/rehearsal/regen-qwen"
    faulted = plan_rehearsal(config_path=config, faults=["empty-answer=0.87"]).config
    assert faulted.output == ".regen/rehearsal/regen-qwen-empty-answer-0-87"
    assert faulted.engine.emulator.faults == ["empty-answer=0.87"]
    assert plan_rehearsal().config.output == "out/rehearsal"
    assert plan_rehearsal(faults=["empty-answer=0.87"]).config.output.startswith("out/rehearsal-")
    with pytest.raises(ConfigError, match="a rehearsal never writes where the GPU run will"):
        plan_rehearsal(config_path=config, out="s3://b/regen/qwen/")
    exported = _node(tmp_path / "e.yaml", "s3://b/regen/qwen")
    data = yaml.safe_load(exported.read_text())
    data["export"] = {"dest": "s3://b/train", "formats": ["specforge"]}
    exported.write_text(yaml.safe_dump(data))
    rehearsal = plan_rehearsal(config_path=exported, out="out/x").config
    assert rehearsal.export is not None and rehearsal.export.dest == "out/x-export"


def test_blocks_register_needs_a_reachable_server(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    proc = run_regen(["blocks", "register"], regen_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "regen: error: PREFECT_API_URL is not set" in proc.stderr
    assert "registered" not in proc.stdout and "Traceback" not in proc.stderr
    dead = {**regen_env, "PREFECT_API_URL": f"http://127.0.0.1:{quiet_port_range(1)}/api"}
    proc = run_regen(["blocks", "register"], dead, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "is not reachable" in proc.stderr and "registered" not in proc.stdout


def test_audit_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = make_dataset(tmp_path / "ds", rows=20, shard_size=10, servers=1)
    with pytest.raises(SystemExit) as exited:
        main(["audit", str(ds.root), "--tokenizer", "/nonexistent"])
    assert exited.value.code == 2
    assert "argument --tokenizer: /nonexistent: no such file or directory" in (
        capsys.readouterr().err
    )
    assert main(["audit", str(tmp_path / "missing")]) == 2
    assert "not a regen dataset" in capsys.readouterr().err


def test_audit_rewrites_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = make_dataset(tmp_path / "ds", rows=20, shard_size=10, servers=1)
    report = ds.root / "report"
    report.mkdir(exist_ok=True)
    (report / "audit.md").write_text("stale\n")
    (report / "audit.json").write_text("{}")
    assert main(["audit", str(ds.root)]) == 0
    assert f"report: {ds.root}/report/audit.md" in capsys.readouterr().out
    assert (report / "audit.md").read_text() != "stale\n"
    assert json.loads((report / "audit.json").read_text())["verdict"] in ("pass", "warn")


@pytest.mark.parametrize("verb", ["rehearse", "run", "check", "audit", "export", "blocks"])
def test_every_verb_has_a_description(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    _, _, rest = capsys.readouterr().out.partition("\n\n")
    assert rest.split("\n")[0] and not rest.startswith(("options:", "positional")), rest[:200]
