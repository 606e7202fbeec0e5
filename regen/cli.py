"""The verbs of `regen` that need no Prefect: check, audit, export, emulator.

They are the library's; `flows/cli.py` builds the command line around them, with the verbs
that run a flow or touch Prefect, and is the `regen` console script. Each verb is thin: the
work is in the library. Nothing heavy is imported until a verb runs, so `regen --help` and a
config error are fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from regen.errors import UserError

# The formats of `regen export`, spelled out so `regen --help` imports nothing heavy
# (tests/test_export.py checks they are regen.export.FORMATS).
FORMATS_CHOICES = ["specforge", "tokenized", "hf-dataset", "messages"]


def _not_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return value


def add_config(p: argparse.ArgumentParser, required: bool) -> None:
    """`--config`, spelled the same for every verb that takes one."""
    p.add_argument(
        "--config", "-c", type=Path, required=required, help="YAML file with a RegenConfig."
    )


def add_library_verbs(verbs: argparse._SubParsersAction[Any]) -> None:
    """Add audit, export and emulator to the `regen` parser's verbs, in this order."""
    p = verbs.add_parser("audit", help="Audit an existing dataset; exit 1 when the gate fails.")
    p.add_argument("dataset", help="Dataset root, a directory or s3://bucket/prefix.")
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="Model directory (or its tokenizer.json) whose chat template measures the loss "
        "mask of turns stored without token ids and is checked against the stored prompts; "
        "default model.tokenizer_path of --config, else its staged model.",
    )
    add_config(p, required=False)
    p.set_defaults(func=_audit)

    p = verbs.add_parser(
        "export",
        help="Write a dataset's committed ok rows in a trainer's format (JSONL or Arrow).",
        description="specforge: SpecForge conversations JSONL; tokenized: input_ids + loss_mask "
        "JSONL; hf-dataset: Arrow dataset (datasets.load_from_disk) of input_ids, loss_mask, "
        "seq_len; messages: {id, messages} JSONL. One file per dataset shard and export.json; "
        "a rerun rewrites only the shards that changed.",
    )
    p.add_argument("dataset", help="Dataset root, a directory or s3://bucket/prefix.")
    p.add_argument("--format", "-f", required=True, choices=FORMATS_CHOICES)
    p.add_argument("--out", "-o", required=True, help="Export directory or s3://bucket/prefix.")
    p.add_argument(
        "--turns",
        choices=["each", "last"],
        default="each",
        help="Token formats: one sample per assistant turn (each, default) or the last only.",
    )
    p.add_argument(
        "--exclude-truncated",
        action="store_true",
        help="Leave out answers cut at max_tokens (finish_reason length).",
    )
    p.add_argument(
        "--min-loss-tokens",
        type=_not_negative,
        default=0,
        metavar="N",
        help="Leave out samples with fewer than N trained (response) tokens.",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="Model directory (or its tokenizer.json): token formats render turns without "
        "stored ids with its chat template; without it such turns are dropped and counted.",
    )
    p.set_defaults(func=_export)

    p = verbs.add_parser(
        "emulator",
        help="One SGLang-compatible emulator server (same as python -m regen.emulator).",
        add_help=False,
    )
    p.set_defaults(func=None)


def _audit(args: argparse.Namespace) -> int:
    from rich.console import Console

    from regen.audit import audit_table, run_audit
    from regen.audit.thresholds import AuditConfig
    from regen.canary import stopped_run
    from regen.config import load_config
    from regen.storage import open_storage

    config = load_config(args.config) if args.config else None
    audit_config = config.audit if config else AuditConfig()
    tokenizer = args.tokenizer
    if tokenizer is None and config is not None:
        staged = config.model.staged_path()
        tokenizer = config.model.tokenizer_path or (staged if staged.is_dir() else None)
    storage = open_storage(args.dataset)
    result = run_audit(
        storage, audit_config, tokenizer_path=tokenizer, stopped=stopped_run(storage)
    )
    Console().print(audit_table(result))
    print(f"verdict: {result.verdict}")
    return 1 if result.verdict == "fail" else 0


def _export(args: argparse.Namespace) -> int:
    from regen.export import ExportOptions
    from regen.export.run import export_dataset
    from regen.storage import open_storage

    options = ExportOptions(
        format=args.format,
        turns=args.turns,
        exclude_truncated=args.exclude_truncated,
        min_loss_tokens=args.min_loss_tokens,
    )
    try:
        summary = export_dataset(
            open_storage(args.dataset),
            open_storage(args.out),
            options,
            tokenizer_path=args.tokenizer,
        )
    except OSError as err:  # a local destination that cannot be written, a full disk
        where = err.filename or args.out
        raise UserError(f"{where}: cannot write the export ({err.strerror or err})") from None
    counts = summary.counts
    dropped = ", ".join(f"{k} {v}" for k, v in counts["dropped"].items()) or "none"
    print(
        f"exported {counts['samples']} samples from {counts['rows_exported']} of "
        f"{counts['rows']} ok rows ({counts['error_rows']} error rows not exported) "
        f"to {summary.dest}"
    )
    print(f"dropped: {dropped}")
    print(f"shards: {len(summary.written)} written, {len(summary.reused)} unchanged")
    return 0
