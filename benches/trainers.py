"""What the trainers would train on from regen's exports: per trainer and format, the rows it
accepted, those equal to regen's, those differing only by the trailing newline, and any other
difference.

A multi-turn thinking rehearsal (support.trainers: one real emulator with Qwen3's reasoning
parser, regen's dispatcher, `turns: all`, three generated turns a conversation, a third of the
conversations without a system message) is exported in each format a trainer reads, and
SpecForge 0.2.0's and speculators 0.9.0's own data code (the driver in .venv-trainers) reads
it; each row is matched, token for token and mask for mask, to regen's `tokenized` rows. The
default size is tests/trainers' own rehearsal (12 conversations, 4 without a system message),
so the table holds the figures those tests assert; --conversations N for more.

Without .venv-trainers the bench says so in one line and exits 0 (`make test-fast` users
need not build it; a --smoke run writes a JSON marked skipped, and a full run leaves the real
results alone); with CI=true that is a failure, as in tests/trainers.

    .venv/bin/python benches/trainers.py [--conversations N] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.config import ExportOptions
from regen.display.figures import markdown_table
from regen.export.exporter import export_dataset
from regen.storage import LocalStorage, Storage
from support.driver import required
from support.emulator import MODEL_DIR
from support.trainers import (
    NEEDS,
    SPECFORGE_SYSTEM,
    TEMPLATE,
    Comparison,
    Trainers,
    as_rows,
    commit_rehearsal,
    compare,
    conversations,
    env_ready,
    regen_rows,
    rehearsal_server,
    tool_conversations,
    without_prefix,
)

COLUMNS = (
    "trainer",
    "format / path",
    "rows accepted",
    "rows equal",
    "rows differing only by the trailing newline",
    "other differences",
)


def _export(source: Storage, dest: Path, fmt: str, **options: Any) -> Path:
    export_dataset(source, LocalStorage(dest), ExportOptions(format=fmt, **options))
    return dest


def _other(result: Comparison, notes: list[str]) -> str:
    """The table's last cell: the named, expected differences and every unexpected one."""
    found = [*notes, *result.other]
    if result.unmatched:
        found.append(f"{result.unmatched} of regen's rows never reached the trainer")
    return "; ".join(found) or "none"


def measure(trainers: Trainers, source: Storage, tmp: Path) -> tuple[list[dict], int]:
    """Each path's comparison, and how many samples regen's `tokenized` export holds."""
    model = str(MODEL_DIR)
    ours = regen_rows(_export(source, tmp / "tok", "tokenized"))
    ours_last = regen_rows(_export(source, tmp / "tok-last", "tokenized", turns="last"))
    (newline,) = trainers.ask("encode", model=model, text="\n")
    system = tuple(trainers.ask("encode", model=model, text=SPECFORGE_SYSTEM))
    results: list[dict] = []

    def record(trainer: str, path: str, result: Comparison, notes: list[str]) -> None:
        results.append(
            {
                "trainer": trainer,
                "path": path,
                "accepted": result.accepted,
                "equal": result.equal,
                "newline_only": result.newline_only,
                "other": _other(result, notes),
                "unexpected": len(result.other) + result.unmatched,
            }
        )

    # SpecForge data.train_data_path: it renders the conversation with its own template.
    sf = _export(source, tmp / "sf", "specforge", single_file=True) / "specforge.jsonl"
    theirs = as_rows(
        trainers.ask(
            "specforge_conversations", path=str(sf), model=model, template=TEMPLATE, last_turn=True
        )
    )
    cut, added = without_prefix(theirs, system)
    trained = sum(1 for _, mask in added if any(mask[: len(system)]))
    notes = [
        f"its own system prompt prepended on {len(added)} rows without one "
        + (f"(TRAINED on {trained})" if trained else "(untrained)")
    ]
    record(
        "SpecForge",
        f"specforge --single-file: build_eagle3_dataset ({TEMPLATE}, train_only_last_turn) vs "
        f"tokenized --turns last",
        compare(cut, ours_last, newline),
        notes if added else [],
    )

    # SpecForge data.prompts_path: pre-tokenized rows pass through.
    tok = _export(source, tmp / "tok1", "tokenized", single_file=True) / "tokenized.jsonl"
    theirs = as_rows(
        trainers.ask("specforge_prompts", path=str(tok), model=model, template=TEMPLATE)
    )
    record(
        "SpecForge",
        "tokenized --single-file: prepare_prompt_tasks (data.prompts_path)",
        compare(theirs, ours),
        [],
    )

    # speculators --data DIR: every *.json/*.jsonl under the per-shard directory.
    theirs = as_rows(
        trainers.ask("speculators_prepare", data=str(tmp / "tok"), model=model, seq_length=4096)
    )
    record(
        "speculators",
        "tokenized (directory): load_and_preprocess_dataset (--data DIR)",
        compare(theirs, ours),
        [],
    )

    # speculators' training loader over the hf-dataset export.
    hf = _export(source, tmp / "hf", "hf-dataset", token_freq=True)
    answer = trainers.ask("speculators_train", path=str(hf), hidden_size=8)
    unavailable = answer["unavailable"]
    record(
        "speculators",
        "hf-dataset: ArrowDataset.__getitem__ + CollateFn",
        compare(as_rows(answer["rows"]), ours),
        [f"{len(unavailable)} rows unavailable"] if unavailable else [],
    )
    freq = trainers.ask("token_freq", path=str(hf), regen=str(hf / "token_freq.pt"))
    results.append(
        {
            "trainer": "speculators",
            "path": "hf-dataset --token-freq: token_freq.pt vs save_token_frequency_distribution",
            "token_freq_equal": freq["regen"] == freq["speculators"],
            "token_ids_counted": len(freq["speculators"]),
        }
    )
    return results, len(ours)


def measure_tools(trainers: Trainers, source: Storage, tmp: Path) -> list[dict]:
    """A tool-call rehearsal's conversation export (calls, results, tools) read by each
    trainer's conversation path, against regen's per-turn samples."""
    model = str(MODEL_DIR)
    (newline,) = trainers.ask("encode", model=model, text="\n")
    ours = regen_rows(_export(source, tmp / "tools-tok", "tokenized"))
    ours_last = regen_rows(_export(source, tmp / "tools-last", "tokenized", turns="last"))
    sf = _export(source, tmp / "tools-sf", "specforge", single_file=True) / "specforge.jsonl"
    found = []
    last = trainers.ask(
        "specforge_conversations", path=str(sf), model=model, template=TEMPLATE, last_turn=True
    )
    found.append(
        (
            "SpecForge",
            f"specforge with tools: build_eagle3_dataset ({TEMPLATE}, train_only_last_turn) vs "
            "tokenized --turns last",
            compare(as_rows(last), ours_last, newline),
        )
    )
    spec = trainers.ask("speculators_conversations", path=str(sf), model=model)
    found.append(
        (
            "speculators",
            "specforge with tools: build_speculator_training_dataset (render boundary per "
            "turn, /render = the model's template) vs tokenized",
            compare(as_rows(spec), ours, newline),
        )
    )
    return [
        {
            "trainer": trainer,
            "path": path,
            "accepted": result.accepted,
            "equal": result.equal,
            "newline_only": result.newline_only,
            "other": _other(result, []),
            "unexpected": len(result.other) + result.unmatched,
        }
        for trainer, path, result in found
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="6 conversations: seconds.")
    args = parser.parse_args()
    if not env_ready():
        if required():
            raise SystemExit(f"trainers bench: CI=true and {NEEDS}")
        print(f"trainers bench skipped: {NEEDS}")
        if args.smoke:  # a full run leaves the real results as they are
            results_path("trainers", smoke=True).write_text(
                json.dumps({"skipped": NEEDS, "smoke": True}, indent=2) + "\n"
            )
        return
    count = 6 if args.smoke else args.conversations
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="regen-trainers-bench-") as name:
        tmp = Path(name)
        with rehearsal_server(tmp / "logs") as endpoint:
            source = commit_rehearsal(
                tmp / "dataset",
                endpoint,
                conversations(count, system_rows=count * 2 // 3, hand_written=False),
                "all",
            )
            tools = commit_rehearsal(tmp / "tools", endpoint, tool_conversations(count), "all")
        trainers = Trainers()
        try:
            results, samples = measure(trainers, source, tmp)
            results += measure_tools(trainers, tools, tmp)
        finally:
            trainers.close()
    rows = [r for r in results if "accepted" in r]
    table = markdown_table(
        COLUMNS,
        [
            (r["trainer"], r["path"], r["accepted"], r["equal"], r["newline_only"], r["other"])
            for r in rows
        ],
        numeric=COLUMNS[2:5],
    )
    print("\n".join(table))
    for r in results:
        if "token_freq_equal" in r:
            print(
                f"\n{r['trainer']} {r['path']}: "
                f"{'equal' if r['token_freq_equal'] else 'DIFFERENT'} "
                f"({r['token_ids_counted']} token ids counted)"
            )
    unexpected = sum(r.get("unexpected", 0) for r in rows)
    if unexpected:
        print(f"{unexpected} rows differ beyond the named differences: see 'other differences'")
    results_path("trainers", smoke=args.smoke).write_text(
        json.dumps(
            {
                "conversations": count,
                "without_system_message": count - count * 2 // 3,
                "samples": samples,
                "paths": results,
                "seconds": round(time.perf_counter() - start, 1),
                "smoke": args.smoke,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
