"""Read at a glance, read back from a real Prefect server: each card's description leads with
its figure, one throughput figure in every place, one dataset card per run ending with the
export command, and a rerun with nothing to do says so (tests/test_glance.py: the figures)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from prefect.client.schemas.objects import State

from regen.config import RegenConfig
from regen.display.figures import sig
from regen.display.naming import artifact_key
from regen.rehearsal import rehearsal_config

if TYPE_CHECKING:
    from prefect.client.schemas.objects import Artifact
    from prefect.states import State

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("prefect_harness")]


@dataclass(frozen=True)
class Run:
    config: RegenConfig
    state: State[Any]


@pytest.fixture(scope="module")
def run(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Run:
    from flows.regenerate import regenerate_completions

    tmp_path = tmp_path_factory.mktemp("glance")
    path = tmp_path / "rehearsal.yaml"
    export = {"dest": str(tmp_path / "train"), "formats": ["tokenized"]}
    settings = {"work_dir": str(tmp_path / "work"), "shard_size": 100, "export": export}
    path.write_text(yaml.safe_dump(settings))
    config = rehearsal_config(config_path=path, out=str(tmp_path / "out"), servers=2)
    return Run(config, regenerate_completions(config, return_state=True))


def _artifacts(state: State[Any]) -> list[Artifact]:
    """Every artifact the run made, in the order made (each card once, whatever its updates)."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    return sorted(found, key=lambda a: str(a.created))


def _by_key(state: State[Any]) -> dict[str, Artifact]:
    return {a.key: a for a in _artifacts(state) if a.key}


CARD = re.compile(r"^100 % · finished in [\d.,]+ (s|min) · ([\d.]+k?) tok/s · quality (ok|warn)")


def test_every_card_leads_with_its_figure(run: Run) -> None:
    assert run.state.is_completed(), run.state.message
    found, output = _by_key(run.state), run.config.output
    described = {key: a.description or "" for key, a in found.items()}
    for key, text in described.items():
        assert text.endswith(" · out") and not text.startswith("out"), (key, text)
    progress = found[artifact_key("generation-progress", output)]
    card = CARD.match(described[progress.key or ""])
    assert card, described[progress.key or ""]
    assert progress.data == 100
    assert "240 / 240 rows generated (100 %), 240 committed" in (progress.description or "")
    # The live card and the summary's say what the progress card says.
    for kind in ("fleet-live", "generation-summary"):
        assert CARD.match(described[artifact_key(kind, output)]), (kind, described)
    assert described[artifact_key("audit-report", output)].startswith("audit ")
    assert described[artifact_key("fleet-report", output)] == "fleet 2/2 healthy · out"
    assert re.match(r"^[\d.]+k? tok/s · over ", described[artifact_key("throughput", output)])
    assert (
        described[artifact_key("export-tokenized", output)]
        == "240 samples · export tokenized · out"
    )


def test_one_total_throughput_in_every_place(run: Run) -> None:
    """`56,200 output tok/s` in one place and `56,600 tok/s` in another was two figures:
    now the run's average, the same in the summary, the live report, the cards and the
    flow's result (what the terminal prints)."""
    summary = run.state.result()
    figure = sig(summary.tokens_per_s)
    found = _by_key(run.state)
    for kind in ("generation-summary", "fleet-live"):
        data = str(found[artifact_key(kind, run.config.output)].data)
        quoted = set(re.findall(r"([\d.,]+) output tok/s", data))
        assert quoted == {figure}, (kind, quoted, figure)
        assert "(run average)" in data
    live = str(found[artifact_key("fleet-live", run.config.output)].data)
    rows = re.findall(r"^\| server-\d \| ([\d.,]+) \|", live, re.M)
    assert len(rows) == 2 and sum(float(r.replace(",", "")) for r in rows) == pytest.approx(
        summary.tokens_per_s, rel=0.02
    ), (rows, summary.tokens_per_s)


def test_one_dataset_card_per_run_ending_with_the_export_command(run: Run) -> None:
    key = artifact_key("dataset", run.config.output)
    cards = [a for a in _artifacts(run.state) if a.key == key]
    assert len(cards) == 1, [a.description for a in cards]
    assert cards[0].description == "240 / 240 rows committed · audit PASS · out" or (
        cards[0].description or ""
    ).startswith("240 / 240 rows committed · audit WARN"), cards[0].description
    data = str(cards[0].data)
    root = run.config.output
    assert "240 rows committed of 240 planned" in data, data
    assert f"regen export {root} -f tokenized --single-file -o {root}-export/tokenized" in data
    assert data.strip().splitlines()[-1].startswith("SpecForge: `data.prompts_path="), data


def test_a_rerun_with_nothing_to_do_says_so(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.regenerate import regenerate_completions
    from flows.runner import _outcome

    again = regenerate_completions(run.config, return_state=True)
    assert again.is_completed(), again.message
    summary = again.result()
    assert not isinstance(summary, State) and summary.rows_generated == 0
    capsys.readouterr()
    assert _outcome(again, run.config) == 0
    said = capsys.readouterr().out
    assert "rows: 240 ok, 0 failed; nothing left to generate" in said, said
    assert "tok/s" not in said, said
    # The rerun's own dataset card: one, saying what the dataset holds.
    key = artifact_key("dataset", run.config.output)
    assert len([a for a in _artifacts(again) if a.key == key]) == 1
    # The first run's line names what it generated at its one figure.
    capsys.readouterr()
    _outcome(run.state, run.config)
    first = capsys.readouterr().out
    figure = sig(run.state.result().tokens_per_s)
    assert "this run generated 240 rows, " in first and f"at {figure} tok/s" in first, first


def test_an_error_rows_example_in_the_audit_carries_its_reason(tmp_path: Path) -> None:
    """A 200,000-character prompt is an error row; the audit's example said `error row` and
    nothing more, the server's reason (over the context length) only in the data."""
    import json

    from flows.regenerate import regenerate_completions

    prompts = tmp_path / "prompts.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"Name a prime above {i}."} for i in range(39)]
    rows.append({"id": "huge", "prompt": "word " * 40_000})
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "rehearsal.yaml"
    settings = {"work_dir": str(tmp_path / "work"), "shard_size": 20, "audit": {"live": "off"}}
    path.write_text(yaml.safe_dump(settings))
    config = rehearsal_config(
        config_path=path, prompts=str(prompts), out=str(tmp_path / "out"), servers=1
    )
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    audit = json.loads((tmp_path / "out" / "report" / "audit.json").read_text())
    [check] = [c for c in audit["checks"] if c["name"] == "error_rows"]
    [example] = check["examples"]
    assert example["id"] == "huge" and example["reason"].startswith("error row: "), example
    assert "context length" in example["reason"], example
    said = (tmp_path / "out" / "report" / "audit.md").read_text()
    assert "- `huge`: error row: " in said and "context length" in said.split("`huge`")[1]
