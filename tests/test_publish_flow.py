"""A run's last step, in this process under a Prefect test server: the provenance the run
records (its engine and chat template, which only it knows), the publication its `publish`
parameter asks for, and the one line its Completed state ends with."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from regen.config import PublishConfig, RegenConfig
from regen.dataset.keys import PROVENANCE_KEY
from regen.display.outcome import DONE
from regen.lossmask.template import template_source
from regen.publish.provenance import read_provenance, regen_version
from regen.rehearsal import rehearsal_config
from regen.storage import LocalStorage
from support.hub import loopback_hub
from tests.support.publish import finished_dataset, prompt_source, publishing_hub

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("prefect_harness")]

REPO_ID = "regen-org/rehearsal"


def _config(tmp_path: Path) -> RegenConfig:
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump({"work_dir": str(tmp_path / "work"), "shard_size": 100}))
    return rehearsal_config(config_path=path, out=str(tmp_path / "out"), servers=2)


def test_a_passing_run_records_its_provenance_and_publishes_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.regenerate import regenerate_completions

    config = _config(tmp_path)
    target = PublishConfig(repo=f"hf://datasets/{REPO_ID}", tokenized=True)
    with loopback_hub() as hub:
        publishing_hub(monkeypatch, hub, tmp_path / "hf")
        # No token: the dataset is made and judged, and the run says the publish failed.
        monkeypatch.delenv("HF_TOKEN")
        state = regenerate_completions(config, publish=target, return_state=True)
        assert state.is_failed(), state
        first, *rest = (state.message or "").splitlines()
        assert first.startswith(f"publish failed: hf://datasets/{REPO_ID}@main: no Hugging")
        assert rest == [
            f"The dataset passed its audit and is kept at {config.output}; publish it with "
            f"`regen publish {config.output} hf://datasets/{REPO_ID}`"
        ]
        # A rerun has nothing to generate: it judges, records and publishes.
        monkeypatch.setenv("HF_TOKEN", "hf_loopback_test_token")
        state = regenerate_completions(config, publish=target, return_state=True)
        files = hub.head(REPO_ID)
        print(f"\nCompleted: {state.message}")

    assert state.is_completed(), state.message
    message = state.message or ""
    assert message.startswith(f"{DONE} 240 rows committed at {config.output} (240 ok, 0 failed)")
    assert f"audit PASS; published to {hub.endpoint}/datasets/{REPO_ID} (commit " in message
    provenance = read_provenance(LocalStorage(Path(config.output)))
    assert provenance is not None and provenance.engine is not None
    assert provenance.engine.kind == "emulator"
    assert provenance.engine.version == f"regen {regen_version()} emulating sglang 0.5.23"
    assert provenance.engine.reasoning_parser == "qwen3"
    found = template_source(Path(config.model.source))
    assert found is not None
    assert provenance.model.chat_template_sha256 == hashlib.sha256(found[1].encode()).hexdigest()
    assert provenance.model.served_name == config.model.served_name
    assert provenance.rows.ok == 240 and provenance.audit.verdict == "pass"
    assert files[PROVENANCE_KEY] == provenance.to_json()
    card = files["README.md"].decode()
    assert "| serving engine | emulator regen" in card and "config_name: tokenized" in card
    assert {f"data/train-{s:06d}.parquet" for s in range(3)} <= set(files)


def test_a_run_that_publishes_nothing_still_ends_with_its_line(tmp_path: Path) -> None:
    from flows.regenerate import RunSummary, regenerate_completions

    config = _config(tmp_path)
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed()
    root = config.output
    assert state.message == (
        f"{DONE} 240 rows committed at {root} (240 ok, 0 failed), audit PASS; next: "
        f"`regen export {root} -f tokenized --single-file -o {root}-export/tokenized` for a "
        f"trainer, or `regen publish {root} hf://datasets/ORG/out` for the Hub"
    )
    summary = state.result()
    assert isinstance(summary, RunSummary) and summary.rows_ok == 240, "its summary, as before"
    assert read_provenance(LocalStorage(Path(root))) is not None


def test_the_publish_flow_publishes_any_finished_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.publish import publish_dataset_flow

    with loopback_hub() as hub:
        publishing_hub(monkeypatch, hub, tmp_path / "hf")
        dataset = finished_dataset(tmp_path / "dataset", prompt_source(hub))
        target = PublishConfig(repo=f"hf://datasets/{REPO_ID}")
        done = publish_dataset_flow(dataset.uri, target, work_dir=str(tmp_path / "work"))
        again = publish_dataset_flow(dataset.uri, target, work_dir=str(tmp_path / "work"))
        files = hub.head(REPO_ID)
    assert done["url"] == f"{hub.endpoint}/datasets/{REPO_ID}" and done["commit"]
    assert any(line.startswith("nothing new:") for line in again["lines"])
    assert (tmp_path / "work" / "publish" / "regen-org--rehearsal" / "repo").is_dir()
    assert {"README.md", PROVENANCE_KEY, "data/train-000000.parquet"} <= set(files)
