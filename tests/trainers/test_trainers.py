"""regen's exports judged by the trainers' own data code: SpecForge 0.2.0 and speculators
0.9.0 (support/trainers_driver.py in .venv-trainers) read each export, and what they would
train on is compared with regen's own rows, token for token and mask for mask.

The one allowed difference is named where it occurs: SpecForge renders a conversation itself
and its Qwen templates end every turn with "<|im_end|>\\n", so its row carries one more token
than the server's: the newline after the last <|im_end|>, which its loss mask trains (the
server stops at <|im_end|> and never generates it). Each test prints
one line `trainers: <trainer> <format>: accepted N, equal N, newline-only N, ...` (pytest -s);
benches/trainers.py prints the same counts as a table.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from regen.config import ExportOptions
from regen.export.exporter import EXPORT_KEY, export_dataset
from regen.storage import LocalStorage, Storage
from support.trainers import (
    HAND_WRITTEN,
    SPECFORGE_SYSTEM,
    TEMPLATE,
    Row,
    TrainerError,
    Trainers,
    as_rows,
    compare,
    regen_rows,
    without_prefix,
)
from tests.trainers.conftest import Rehearsal

# One xdist worker (tests/support/groups.py): the rehearsal and the driver are built once.
pytestmark = pytest.mark.timeout(300)


def _export(source: Storage, dest: Path, fmt: str, **options: Any) -> Any:
    return export_dataset(source, LocalStorage(dest), ExportOptions(format=fmt, **options))


def _judge(name: str, theirs: list[Row], ours: list[Row], newline: int | None = None) -> None:
    """Every trainer row is one of regen's rows, exactly or (with `newline`) followed by the
    newline token, trained; regen's rows are all matched once. Prints the counts."""
    result = compare(theirs, ours, newline)
    assert not result.other, f"{name}: {result.other}"
    assert not result.unmatched, f"{name}: {result.unmatched} of regen's rows never reached it"
    print(result.line(name))


def test_specforge_conversations_are_the_servers_tokens_but_for_the_newline(
    trainers: Trainers, rehearsal: Rehearsal, tmp_path: Path
) -> None:
    """build_eagle3_dataset over the `specforge` single file, last turn trained (SpecForge
    renders every earlier turn without its reasoning, as the server saw them): each row is
    regen's last-turn sample plus the trailing newline; a row without a system message also
    gets the template's system prompt, which the export warns about."""
    summary = _export(rehearsal.all_turns, tmp_path / "sf", "specforge", single_file=True)
    assert sorted(p.name for p in (tmp_path / "sf").iterdir()) == [EXPORT_KEY, "specforge.jsonl"]
    assert any("4 of 12 conversations have no system message" in n for n in summary.notes())
    _export(rehearsal.all_turns, tmp_path / "tok", "tokenized", turns="last")
    ours = regen_rows(tmp_path / "tok")
    model = str(rehearsal.model)
    newline = trainers.ask("encode", model=model, text="\n")
    system = tuple(trainers.ask("encode", model=model, text=SPECFORGE_SYSTEM))
    assert len(newline) == 1
    rows = trainers.ask(
        "specforge_conversations",
        path=str(tmp_path / "sf" / "specforge.jsonl"),
        model=model,
        template=TEMPLATE,
        last_turn=True,
    )
    theirs = as_rows(rows)
    assert len(theirs) == 12
    # The template's system prompt, the tokens the server never saw, on the 4 rows without one.
    cut, added = without_prefix(theirs, system)
    assert len(added) == 4
    assert all(not any(mask[: len(system)]) for _, mask in added)
    _judge(f"specforge {TEMPLATE} (system prompt added on 4)", cut, ours, newline[0])

    # By default SpecForge trains every assistant turn: with turns: all each is the model's.
    every = as_rows(
        trainers.ask(
            "specforge_conversations",
            path=str(tmp_path / "sf" / "specforge.jsonl"),
            model=model,
            template=TEMPLATE,
            last_turn=False,
        )
    )
    assert sum(map(sum, (m for _, m in every))) > sum(map(sum, (m for _, m in theirs)))


def test_specforge_pretokenized_path_takes_regens_rows_exactly(
    trainers: Trainers, rehearsal: Rehearsal, tmp_path: Path
) -> None:
    """data.prompts_path over the `tokenized` single file: every sample, every token, exactly.
    SpecForge opens one file: the per-shard directory is refused (hence --single-file)."""
    _export(rehearsal.all_turns, tmp_path / "tok", "tokenized", single_file=True)
    model = str(rehearsal.model)
    theirs = trainers.ask(
        "specforge_prompts",
        path=str(tmp_path / "tok" / "tokenized.jsonl"),
        model=model,
        template=TEMPLATE,
    )
    ours = regen_rows(tmp_path / "tok")
    assert len(ours) == 36  # 12 conversations x 3 generated turns
    _judge("specforge tokenized (prompts_path)", as_rows(theirs), ours)

    _export(rehearsal.all_turns, tmp_path / "dir", "tokenized")
    with pytest.raises(TrainerError, match="IsADirectoryError"):
        trainers.ask(
            "specforge_prompts", path=str(tmp_path / "dir"), model=model, template=TEMPLATE
        )


def test_speculators_prepare_data_reads_the_export_directory(
    trainers: Trainers, rehearsal: Rehearsal, tmp_path: Path
) -> None:
    """load_and_preprocess_dataset (`--data DIR`) over the per-shard `tokenized` directory: it
    reads every *.json/*.jsonl under DIR, so the record must not be one. regen's rows pass
    through exactly; a VERSION 1 export (export.json beside the shards) fails its cast."""
    dest = tmp_path / "tok"
    summary = _export(rehearsal.all_turns, dest, "tokenized")
    assert summary.counts["shards"] == 2
    theirs = trainers.ask(
        "speculators_prepare", data=str(dest), model=str(rehearsal.model), seq_length=4096
    )
    _judge("speculators tokenized (--data DIR)", as_rows(theirs), regen_rows(dest))

    old = tmp_path / "old"
    shutil.copytree(dest, old)
    (old / EXPORT_KEY).rename(old / "export.json")
    with pytest.raises(TrainerError, match="DatasetGenerationError"):
        trainers.ask(
            "speculators_prepare", data=str(old), model=str(rehearsal.model), seq_length=4096
        )


def test_speculators_training_loader_reads_the_hf_dataset(
    trainers: Trainers, rehearsal: Rehearsal, tmp_path: Path
) -> None:
    """ArrowDataset.__getitem__ (stand-in hidden states holding each row's own ids) and
    CollateFn over the hf-dataset export: every row available, equal to regen's; the numpy
    format older regen wrote crashes the loader in torch.equal."""
    dest = tmp_path / "hf"
    _export(rehearsal.all_turns, dest, "hf-dataset")
    _export(rehearsal.all_turns, tmp_path / "tok", "tokenized")
    answer = trainers.ask("speculators_train", path=str(dest), hidden_size=8)
    assert answer["unavailable"] == []
    _judge(
        "speculators hf-dataset (ArrowDataset)",
        as_rows(answer["rows"]),
        regen_rows(tmp_path / "tok"),
    )
    tokens = sum(len(r["input_ids"]) for r in answer["rows"])
    assert answer["collated"]["input_ids"] == [1, tokens]
    assert answer["collated"]["hidden_states"] == [1, tokens, 3 * 8]
    assert answer["collated_loss_tokens"] == sum(sum(r["loss_mask"]) for r in answer["rows"])

    old = tmp_path / "old"
    shutil.copytree(dest, old)
    state = json.loads((old / "state.json").read_text())
    (old / "state.json").write_text(json.dumps({**state, "_format_type": "numpy"}))
    with pytest.raises(TrainerError, match=r"equal\(\): argument 'other'.*numpy.ndarray"):
        trainers.ask("speculators_train", path=str(old), hidden_size=8)


@pytest.mark.parametrize("fmt", ["hf-dataset", "tokenized"])
def test_token_freq_is_speculators_own(
    trainers: Trainers, rehearsal: Rehearsal, tmp_path: Path, fmt: str
) -> None:
    """regen's token_freq.pt (torch.load, weights_only) is what speculators'
    save_token_frequency_distribution counts over the same rows."""
    _export(rehearsal.all_turns, tmp_path / "hf", "hf-dataset")
    dest = tmp_path / fmt
    _export(rehearsal.all_turns, dest, fmt, token_freq=True)
    answer = trainers.ask(
        "token_freq", path=str(tmp_path / "hf"), regen=str(dest / "token_freq.pt")
    )
    assert answer["regen"] == answer["speculators"] and len(answer["regen"]) > 10


def test_generated_only_trains_only_the_models_answers(
    trainers: Trainers, rehearsal: Rehearsal, tmp_path: Path
) -> None:
    """A `turns: last` dataset's earlier answer came with the prompts: by default the
    `specforge` export leaves it out, so SpecForge (every turn trained, its default) trains
    exactly regen's response tokens (and the trailing newline); with --no-generated-only it
    trains the hand-written one as well."""
    model = str(rehearsal.model)
    _export(rehearsal.last_turn, tmp_path / "tok", "tokenized")
    ours = regen_rows(tmp_path / "tok")
    newline = trainers.ask("encode", model=model, text="\n")[0]
    expected = sorted(
        (*(i for i, m in zip(ids, mask, strict=True) if m), newline) for ids, mask in ours
    )

    def trained(dest: Path) -> list[tuple[int, ...]]:
        rows = trainers.ask(
            "specforge_conversations",
            path=str(dest / "specforge.jsonl"),
            model=model,
            template=TEMPLATE,
            last_turn=False,
        )
        return sorted(
            tuple(i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m) for r in rows
        )

    summary = _export(rehearsal.last_turn, tmp_path / "gen", "specforge", single_file=True)
    assert summary.record["generated_only"] is True
    assert summary.counts["input_turns_left_out"] == len(expected)  # one hand-written each
    assert HAND_WRITTEN not in (tmp_path / "gen" / "specforge.jsonl").read_text()
    assert trained(tmp_path / "gen") == expected
    print(f"trainers: specforge generated-only: trained tokens equal on {len(expected)} rows")

    summary = _export(
        rehearsal.last_turn, tmp_path / "all", "specforge", single_file=True, generated_only=False
    )
    assert summary.record["generated_only"] is False
    extra = sum(map(len, trained(tmp_path / "all"))) - sum(map(len, expected))
    hand = len(trainers.ask("encode", model=model, text=HAND_WRITTEN))
    assert extra >= hand * len(expected)
    print(f"trainers: specforge with the input's answers: {extra} more tokens trained")


def test_tool_conversations_train_the_models_calls_in_both_trainers(
    trainers: Trainers, rehearsal: Rehearsal, tmp_path: Path
) -> None:
    """A tool-call rehearsal (turns: all; given results kept where the model made the given
    call, else the conversation stops there) exported as `specforge` (calls, results and the
    tools as SGLang rendered them) and `tokenized`. SpecForge's build_eagle3_dataset trains the
    last turn exactly as regen's sample but for the newline, and never a tool result;
    speculators' build_speculator_training_dataset (its per-turn render boundary, /render
    stood in for by the model's template) gives regen's per-turn samples, each but for the
    newline; speculators' --data path takes the tokenized rows as they are."""
    model = str(rehearsal.model)
    _export(rehearsal.tools, tmp_path / "sf", "specforge", single_file=True)
    lines = [json.loads(x) for x in (tmp_path / "sf" / "specforge.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and all(
        json.loads(line["tools"])[0]["type"] == "function" for line in lines
    )
    roles = [[m["role"] for m in line["conversations"]] for line in lines]
    assert roles.count(["system", "user", "assistant"]) == 4  # the other call: stopped there
    full = ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert roles.count(full) == 4
    calls = [m for line in lines for m in line["conversations"] if m.get("tool_calls")]
    assert len(calls) == 12 and all("reasoning_content" in m for m in calls)
    results = [m for line in lines for m in line["conversations"] if m["role"] == "tool"]
    assert all(r["tool_call_id"].startswith("call_") for r in results)  # paired to the model's

    _export(rehearsal.tools, tmp_path / "last", "tokenized", turns="last")
    _export(rehearsal.tools, tmp_path / "tok", "tokenized")
    newline = trainers.ask("encode", model=model, text="\n")[0]
    response = trainers.ask("encode", model=model, text="<tool_response>")[0]
    theirs = as_rows(
        trainers.ask(
            "specforge_conversations", path=str(tmp_path / "sf" / "specforge.jsonl"),
            model=model, template=TEMPLATE, last_turn=True,
        )
    )  # fmt: skip
    _judge("specforge tools (last turn)", theirs, regen_rows(tmp_path / "last"), newline)
    every = as_rows(
        trainers.ask(
            "specforge_conversations", path=str(tmp_path / "sf" / "specforge.jsonl"),
            model=model, template=TEMPLATE, last_turn=False,
        )
    )  # fmt: skip
    masked = [m for ids, mask in every for i, m in zip(ids, mask, strict=True) if i == response]
    assert len(masked) == 4 and not any(masked)  # the given results: context, never trained

    spec = trainers.ask(
        "speculators_conversations", path=str(tmp_path / "sf" / "specforge.jsonl"), model=model
    )
    ours = regen_rows(tmp_path / "tok")
    assert len(ours) == 16  # 4 conversations x 3 turns, 4 x 1
    _judge("speculators tools (render boundary)", as_rows(spec), ours, newline)
    prepared = trainers.ask(
        "speculators_prepare", data=str(tmp_path / "tok"), model=model, seq_length=4096
    )
    _judge("speculators tools tokenized (--data DIR)", as_rows(prepared), ours)
