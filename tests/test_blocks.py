"""Saved blocks: they round-trip by name, validate into the config, and never show a secret."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from blocks import FleetConfig, ModelSource, load_block, register_blocks
from regen.config import (
    BenchConfig,
    EmulatorConfig,
    EngineConfig,
    RegenConfig,
    SpeculativeConfig,
    parse_config,
)
from support.s3 import MotoS3

# Saving and loading a block talks to a Prefect API; validation and repr are plain pydantic.
needs_prefect = pytest.mark.usefixtures("prefect_harness")

TOKEN = "hf_secret_token_do_not_print"
API_KEY = "sk-server-key-do-not-print"
AWS_SECRET = "aws-secret-key-do-not-print"


def _name(prefix: str) -> str:
    # Parallel-safe: each test saves under its own name in the shared harness.
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _config(tmp_path: Path) -> RegenConfig:
    return parse_config(
        {
            "model": {"source": str(tmp_path / "model"), "served_name": "inline"},
            "engine": {"kind": "emulator", "gpus": [0]},
            "prompts": str(tmp_path / "prompts.jsonl"),
            "output": str(tmp_path / "out"),
        }
    )


@needs_prefect
def test_register_blocks_lists_regen_and_aws_types() -> None:
    names = register_blocks()
    assert {"regen-fleet-config", "regen-model-source", "s3-bucket", "aws-credentials"} <= set(
        names
    )


@needs_prefect
def test_fleet_config_saves_loads_and_validates_to_engine() -> None:
    name = _name("node")
    FleetConfig(
        engine=EngineConfig(
            python="/opt/sglang-venv/bin/python",
            gpus=[0, 1, 2],
            base_port=31000,
            speculative=SpeculativeConfig(num_steps=2),
            api_key=SecretStr(API_KEY),
            launcher="serve",
            min_servers=2,
            bench=BenchConfig(concurrency=4),
            emulator=EmulatorConfig(tokens_per_s=99.0),
        )
    ).save(name)

    loaded = load_block(FleetConfig, name)
    engine = loaded.engine

    assert isinstance(engine, EngineConfig)
    assert engine.gpus == [0, 1, 2]
    assert engine.base_port == 31000
    assert engine.speculative.num_steps == 2
    assert engine.api_key is not None and engine.api_key.get_secret_value() == API_KEY
    # Every engine setting is saved, not only the ones a hand-made copy listed.
    assert engine.launcher == "serve" and engine.min_servers == 2
    assert engine.bench.concurrency == 4 and engine.emulator.tokens_per_s == 99.0


def test_fleet_config_with_a_bad_setting_fails_validation() -> None:
    with pytest.raises(ValidationError, match="gpus"):
        FleetConfig.model_validate({"engine": {"python": "/usr/bin/python3", "gpus": [0, 0]}})


def test_fleet_config_with_an_unknown_key_is_an_error() -> None:
    with pytest.raises(ValidationError, match="base_prot"):
        FleetConfig.model_validate({"engine": {"python": "/usr/bin/python3", "base_prot": 1}})


def test_fleet_config_names_its_python() -> None:
    with pytest.raises(ValidationError, match=r"engine\.python"):
        FleetConfig.model_validate({"engine": {"gpus": [0]}})


@needs_prefect
def test_model_source_saves_and_loads_with_its_token() -> None:
    name = _name("model")
    token = SecretStr(TOKEN)
    ModelSource(source="hf://Qwen/Qwen3.6-27B", served_name="qwen", hf_token=token).save(name)

    loaded = load_block(ModelSource, name)

    assert loaded.model().source == "hf://Qwen/Qwen3.6-27B"
    assert loaded.hf_token is not None and loaded.hf_token.get_secret_value() == TOKEN


@pytest.mark.parametrize(
    "block",
    [
        ModelSource(source="hf://org/repo", served_name="m", hf_token=SecretStr(TOKEN)),
        FleetConfig(engine=EngineConfig(python="/usr/bin/python3", api_key=SecretStr(TOKEN))),
    ],
    ids=["model-source", "fleet-config"],
)
def test_secrets_are_not_shown(block: FleetConfig | ModelSource) -> None:
    for shown in (repr(block), str(block), block.model_dump_json(), str(block.model_dump())):
        assert TOKEN not in shown


@needs_prefect
def test_open_run_applies_every_named_block(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from prefect.blocks.system import Secret
    from prefect_aws import AwsCredentials, S3Bucket

    from flows.params import open_run

    fleet, model, bucket, secret = (_name(p) for p in ("fleet", "model", "bucket", "key"))
    FleetConfig(
        engine=EngineConfig(
            kind="emulator", python="/usr/bin/python3", gpus=[0, 1], base_port=32000
        )
    ).save(fleet)
    ModelSource(
        source=str(tmp_path / "weights"), served_name="saved", hf_token=SecretStr(TOKEN)
    ).save(model)
    S3Bucket(bucket_name="data", bucket_folder="regen/run-1", credentials=AwsCredentials()).save(
        bucket
    )
    Secret(value=SecretStr(API_KEY)).save(secret)

    with caplog.at_level(logging.DEBUG):
        run = open_run(
            _config(tmp_path),
            fleet_block=fleet,
            model_block=model,
            storage_block=bucket,
            api_key_secret=secret,
        )
    # What a log line that prints the resolved run would show.
    logged = caplog.text + f"resolved {run} / {run.config!r}"

    assert run.config.engine.gpus == [0, 1] and run.config.engine.base_port == 32000
    assert run.config.model.served_name == "saved"
    assert run.config.output == "s3://data/regen/run-1"
    assert run.storage is not None and run.storage.uri == run.config.output
    assert run.config.engine.api_key is not None
    assert run.config.engine.api_key.get_secret_value() == API_KEY
    assert run.hf_token == TOKEN
    assert TOKEN not in logged and API_KEY not in logged
    assert "saved" in logged


def test_open_run_without_blocks_is_the_config(tmp_path: Path) -> None:
    from flows.params import open_run

    config = _config(tmp_path)
    run = open_run(config)
    assert run.config == config and run.hf_token is None and run.opened is None


@needs_prefect
def test_storage_block_credentials_reach_the_run_storage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, moto: MotoS3
) -> None:
    """The S3Bucket block's keys and endpoint, not the worker's environment, open the output."""
    from prefect_aws import AwsClientParameters, AwsCredentials, S3Bucket

    from flows.params import open_run

    # Nothing to fall back on: without the block's credentials and endpoint this fails.
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    bucket, name = moto.create_bucket(), _name("bucket")
    credentials = AwsCredentials(
        aws_access_key_id="AKIDBLOCK",
        aws_secret_access_key=SecretStr(AWS_SECRET),
        region_name="us-east-1",
        aws_client_parameters=AwsClientParameters(endpoint_url=moto.endpoint_url),
    )
    S3Bucket(bucket_name=bucket, bucket_folder="runs/r1", credentials=credentials).save(name)

    with caplog.at_level(logging.DEBUG):
        run = open_run(_config(tmp_path), storage_block=name)
        assert run.storage is not None
        run.storage.write_bytes("run.json", b"{}")

    assert moto.storage(bucket, "runs/r1").read_bytes("run.json") == b"{}"
    assert run.config.output == run.storage.uri == f"s3://{bucket}/runs/r1"
    options = run.storage.polars_options()  # what polars reads the shards with
    assert options is not None and options["aws_access_key_id"] == "AKIDBLOCK"
    assert AWS_SECRET not in caplog.text + f"resolved {run} / {run!r}"
