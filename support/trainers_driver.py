"""Runs inside .venv-trainers (never in regen's venv): SpecForge 0.2.0's and speculators
0.9.0's own data code as the judge of regen's exports.

One JSON request a line on stdin, one JSON answer a line on stdout, so the seconds importing
torch and transformers cost are paid once per test session. Ops, each returning the rows the
trainer would train on as plain lists (the trainers shuffle and drop `id`, so the tests match
rows by their tokens):
- specforge_conversations {path, model, template, last_turn}: `build_eagle3_dataset` over a
  conversations JSONL (the raw `train_data_path` path);
- specforge_prompts {path, model, template}: `prepare_prompt_tasks`, the `prompts_path` path
  (pre-tokenized rows pass through, a raw file goes through build_eagle3_dataset);
- speculators_prepare {data, model, seq_length}: `load_and_preprocess_dataset` (`--data`);
- speculators_conversations {path, model}: `build_speculator_training_dataset` over a
  conversations JSONL with `tools`, vLLM's /render stood in for by `apply_chat_template`;
- speculators_train {path, hidden_size}: `ArrowDataset.__getitem__` over an hf-dataset export
  with stand-in hidden-state files (the token ids each row's own), then `CollateFn`;
- token_freq {path, regen}: `save_token_frequency_distribution` over the export, and regen's
  own token_freq.pt read back with torch.load(weights_only=True).
An exception is answered as {"exception": "Type: message"}, so a test can pin a trainer's
refusal (a directory given to SpecForge) as well as its acceptance.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

with contextlib.redirect_stdout(io.StringIO()):  # keep import chatter off the answer channel
    import datasets  # type: ignore[import-untyped]
    import torch
    from hs_connectors import FileTransfer
    from safetensors.torch import save_file
    from specforge.data.preprocessing import build_eagle3_dataset
    from specforge.data.prompt_builder import prepare_prompt_tasks
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset
    from speculators.train.data import ArrowDataset, CollateFn
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from transformers import AutoTokenizer

datasets.disable_progress_bars()
logging.disable(logging.WARNING)


def _flat(value: Any) -> list[int]:
    """A trainer's tensor or list, [1, L] or [L], as a flat list of ints."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], list):
        value = value[0]
    return [int(v) for v in value]


def _rows(dataset: Any) -> list[dict[str, list[int]]]:
    return [
        {"input_ids": _flat(r["input_ids"]), "loss_mask": _flat(r["loss_mask"])} for r in dataset
    ]


def specforge_conversations(path: str, model: str, template: str, last_turn: bool) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(model)
    raw = datasets.load_dataset("json", data_files=path, split="train")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # "we will use the system prompt from the data", per row
        out = build_eagle3_dataset(
            raw, tokenizer, template, max_length=100_000, num_proc=1,
            train_only_last_turn=last_turn,
        )  # fmt: skip
    return _rows(out)


def encode(model: str, text: str) -> list[int]:
    """The model's tokenizer on `text`, no special tokens added (a template's own text)."""
    return [
        int(i) for i in AutoTokenizer.from_pretrained(model).encode(text, add_special_tokens=False)
    ]


def specforge_prompts(path: str, model: str, template: str) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(model)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        tasks = prepare_prompt_tasks(
            path, tokenizer, chat_template=template, max_length=100_000,
            is_preformatted=False, train_only_last_turn=False, cache_dir=None,
            cache_key=None, num_proc=1,
        )  # fmt: skip
    return [
        {
            "input_ids": _flat(t["payload"]["input_ids"]),
            "loss_mask": _flat(t["payload"]["loss_mask"]),
        }
        for t in tasks
    ]


def speculators_prepare(data: str, model: str, seq_length: int) -> Any:
    with contextlib.redirect_stdout(io.StringIO()):
        out, _ = load_and_preprocess_dataset(
            model, [data], seq_length=seq_length, build_dataset_num_proc=1
        )
    return _rows(out)


def speculators_conversations(path: str, model: str) -> Any:
    """`build_speculator_training_dataset` over a conversations JSONL (with its `tools`
    column): speculators' own normaliser and per-turn render-boundary masks, with vLLM's
    /render stood in for by the model's own `apply_chat_template` (what /render runs)."""
    from speculators.data_generation import preprocessing

    tokenizer = AutoTokenizer.from_pretrained(model)

    def render(endpoint: str, messages: Any, *, add_generation_prompt: bool, **kw: Any) -> Any:
        return tokenizer.apply_chat_template(
            messages, tools=kw.get("tools"), add_generation_prompt=add_generation_prompt,
            tokenize=True, return_dict=False,
        )  # fmt: skip

    raw = datasets.load_dataset("json", data_files=path, split="train")
    preprocessing.render_conversation = render
    with contextlib.redirect_stdout(io.StringIO()):
        out = preprocessing.build_speculator_training_dataset(
            raw, tokenizer, max_length=100_000, num_proc=1, render_endpoint="stand-in"
        )
    return _rows(out)


def speculators_train(path: str, hidden_size: int) -> Any:
    """Every row through __getitem__ with a stand-in hidden-state file holding its own ids (as
    the target model's extraction would), then all of them through CollateFn."""
    rows = datasets.load_from_disk(path).with_format(None)
    with tempfile.TemporaryDirectory(prefix="hs-") as tmp:
        for i, ids in enumerate(rows["input_ids"]):
            states = torch.zeros(len(ids), 4, hidden_size, dtype=torch.bfloat16)
            save_file(
                {"hidden_states": states, "token_ids": torch.tensor(ids)},
                f"{tmp}/hs_{i}.safetensors",
            )
        dataset = ArrowDataset(
            max_len=100_000, datapath=path, transfer=FileTransfer(Path(tmp)), on_missing="raise"
        )
        items = [dataset[i] for i in range(len(dataset))]
    unavailable = [i for i, item in enumerate(items) if not isinstance(item, dict)]
    ok = [item for item in items if isinstance(item, dict)]
    batch = CollateFn(max_len=sum(int(b["lengths"][0]) for b in ok) or 1, hidden_size=hidden_size)(
        ok
    )
    return {
        "rows": [
            {"input_ids": _flat(item["input_ids"]), "loss_mask": _flat(item["loss_mask"])}
            for item in ok
        ],
        "unavailable": unavailable,
        "collated": {k: list(v.shape) for k, v in batch.items() if hasattr(v, "shape")},
        "collated_loss_tokens": int(batch["loss_mask"].sum()),
    }


def token_freq(path: str, regen: str | None) -> Any:
    with (
        tempfile.TemporaryDirectory(prefix="freq-") as tmp,
        contextlib.redirect_stderr(io.StringIO()),
    ):
        save_token_frequency_distribution(datasets.load_from_disk(path), f"{tmp}/token_freq.pt")
        theirs = torch.load(f"{tmp}/token_freq.pt", weights_only=True)
    ours = torch.load(regen, weights_only=True) if regen else None
    return {
        "speculators": sorted(theirs.items()),
        "regen": sorted(ours.items()) if ours is not None else None,
    }


OPS: dict[str, Callable[..., Any]] = {
    "specforge_conversations": specforge_conversations,
    "specforge_prompts": specforge_prompts,
    "encode": encode,
    "speculators_prepare": speculators_prepare,
    "speculators_conversations": speculators_conversations,
    "speculators_train": speculators_train,
    "token_freq": token_freq,
}


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"result": OPS[request.pop("op")](**request)}
        except Exception as exc:  # reported to the test, which judges it
            answer = {"exception": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
