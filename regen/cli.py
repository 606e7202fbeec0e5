"""The `regen` command line's Prefect-free half: audit, export, publish, status, estimate, emulator.

They are the library's branches of the one `regen` parser, which `flows/cli.py` builds (it is
the console script, and holds the verbs that run a flow or touch Prefect): it hands its verbs
to `add_library_verbs`, and takes `add_config` and the argument types from here, so an option
is spelled and checked one way for every verb. Each verb is thin: the work is in the library.
Nothing heavy is imported until a verb runs, so `regen --help` and a config error are fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from regen.errors import ConfigError, UsageError, UserError

# The formats of `regen export`, spelled out so `regen --help` imports nothing heavy
# (tests/test_export.py checks they are regen.export.FORMATS).
FORMATS_CHOICES = ["specforge", "tokenized", "hf-dataset", "messages"]


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {least}")
    return value


def _not_negative(text: str) -> int:
    return _whole(text, 0)


def positive_int(text: str) -> int:
    """A count of something (servers, prompts, GPUs): 1 or more."""
    return _whole(text, 1)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number > 0")
    return value


def _tokenizer(text: str) -> Path:
    """`--tokenizer`: a model directory with a tokenizer.json, or the file itself; anything
    else is argparse's usage error (exit 2), never a failed audit's 1 after the reading."""
    path = Path(text).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        what = "has no tokenizer.json" if path.is_dir() else "no such file or directory"
        raise argparse.ArgumentTypeError(f"{text}: {what}")
    return path


def add_config(p: argparse.ArgumentParser, required: bool) -> None:
    """`--config`, spelled the same for every verb that takes one."""
    p.add_argument(
        "--config", "-c", type=Path, required=required, help="YAML file with a RegenConfig."
    )


def add_library_verbs(verbs: argparse._SubParsersAction[Any]) -> None:
    """Add audit, export, publish, status, estimate and emulator to the `regen` parser's
    verbs, in this order."""
    p = verbs.add_parser(
        "audit",
        help="Audit an existing dataset; exit 1 when the gate fails.",
        description="Audit a dataset's committed rows with the gate's checks (thresholds from "
        "--config's audit: section, else the defaults), print the table and rewrite "
        "report/audit.md, report/audit.json and the plots. Exit 0 on pass or warn, 1 when the "
        "audit fails, 2 when it cannot run (a bad argument, not a dataset).",
    )
    p.add_argument("dataset", help="Dataset root, a directory or s3://bucket/prefix.")
    p.add_argument(
        "--tokenizer",
        type=_tokenizer,
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
        "seq_len; messages: {id, messages} JSONL. One file per dataset shard (or one file, "
        "--single-file) and the record .regen-export; a rerun rewrites only what changed. "
        "A dataset whose last audit failed is refused (exit 1) unless --allow-failed; a "
        "directory holding another format's export is refused (exit 2).",
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
        type=_tokenizer,
        help="Model directory (or its tokenizer.json): token formats render turns without "
        "stored ids with its chat template; without it such turns are dropped and counted.",
    )
    p.add_argument(
        "--generated-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="specforge/messages: leave out the assistant turns that came with the input, so "
        "only the target model's answers are trained (default: on for turns: last datasets).",
    )
    p.add_argument(
        "--single-file",
        action="store_true",
        help="JSONL formats: write one <format>.jsonl instead of a file per shard (SpecForge "
        "opens one file: data.train_data_path / data.prompts_path).",
    )
    p.add_argument(
        "--token-freq",
        action="store_true",
        help="Token formats: also write token_freq.pt (speculators' token frequencies).",
    )
    p.add_argument(
        "--allow-failed",
        action="store_true",
        help="Export a dataset even though its last audit failed.",
    )
    p.set_defaults(func=_export)

    p = verbs.add_parser(
        "publish",
        help="Push a finished dataset to a Hugging Face Hub dataset repo with its card.",
        description="Publish a finished, audited dataset to hf://datasets/ORG/NAME: each ok "
        "row's conversation as Parquet (config `default`, split `train`; with --tokenized "
        "also the hf-dataset export's rows as config `tokenized`), the report's plots, "
        "report/provenance.json and a dataset card made from what the run recorded. The repo "
        "is created private unless --public; the files are staged under --staging and only "
        "what the branch lacks is uploaded, so a rerun resumes and a second publish uploads "
        "nothing. Refused (exit 1) for a run the live gate stopped, an incomplete one, an "
        "audit older than the data, or a failed audit unless --allow-failed; exit 2 for a "
        "usage mistake (not a dataset, never audited, no token or no write access). The "
        "token is HF_TOKEN or `hf auth login`'s.",
    )
    p.add_argument("dataset", help="Dataset root, a directory or s3://bucket/prefix.")
    p.add_argument("repo", help="hf://datasets/ORG/NAME (or hf://ORG/NAME).")
    p.add_argument(
        "--revision", default="main", help="The branch to commit to (created when missing)."
    )
    p.add_argument(
        "--public", action="store_true", help="Create the repo public (default private)."
    )
    p.add_argument(
        "--tokenized",
        action="store_true",
        help="Also publish config `tokenized`: id, input_ids, loss_mask, seq_len (the "
        "hf-dataset export's rows).",
    )
    p.add_argument(
        "--tokenizer",
        type=_tokenizer,
        help="With --tokenized: the model directory whose chat template renders turns stored "
        "without token ids (else they are left out and counted); its template's hash goes "
        "into a provenance the run did not record.",
    )
    p.add_argument(
        "--license",
        help="The card's license id (default: the prompt source's card's, else `unknown`).",
    )
    p.add_argument(
        "--allow-failed", action="store_true", help="Publish even though the audit failed."
    )
    p.add_argument(
        "--staging",
        type=Path,
        help="Where the repo's files are made first (default .regen/publish/ORG--NAME).",
    )
    p.set_defaults(func=_publish)

    p = verbs.add_parser(
        "status",
        help="A run at a glance from its output alone: progress, ETA, tok/s, live gate, holder.",
        description="Read a dataset root (a directory or s3://bucket/prefix) as any shell or "
        "machine can, no Prefect needed: progress.json (rows generated, the last minute's "
        "output tok/s, the ETA as a UTC clock time and a duration, the rolling audit), the "
        "output's lease (the run that holds it: pid, host, flow run, and whether it is "
        "alive), the committed shards' manifests, and once over the stop or the audit's "
        "verdict. Exit 0 when the root holds a run, 1 when it holds none.",
    )
    p.add_argument("dataset", help="Dataset root, a directory or s3://bucket/prefix.")
    p.set_defaults(func=_status)

    p = verbs.add_parser(
        "estimate",
        help="How long the config's prompt set takes on N GPUs, and its dataset's size.",
        description="Read and validate the prompts as the run's plan does, count the answers "
        "regeneration.turns asks for, and at a per-GPU decode rate (--tok-s-per-gpu, or "
        "measured on the node by the fleet's benchmark: --rate-from a dataset whose "
        "report/fleet.json has it) print the hours on each --gpus count (default the "
        "config's servers) and the output's size (regen check's estimate). Every answer at "
        "sampling.max_tokens bounds the tokens, not the time (the rate is an estimate); "
        "--mean-tokens gives the likely time beside it. Nothing is launched and the output "
        "is not touched.",
    )
    add_config(p, required=True)
    rate = p.add_mutually_exclusive_group(required=True)
    rate.add_argument(
        "--tok-s-per-gpu", type=_positive_float, metavar="R", help="Output tok/s one GPU decodes."
    )
    rate.add_argument(
        "--rate-from",
        metavar="DATASET",
        help="A dataset (directory or s3://) made on the node: its fleet benchmark's median "
        "server speed (report/fleet.json, engine.bench).",
    )
    p.add_argument(
        "--gpus",
        type=positive_int,
        action="append",
        metavar="N",
        help="GPUs to estimate for (repeatable; default the config's servers).",
    )
    p.add_argument(
        "--mean-tokens",
        type=_positive_float,
        metavar="T",
        help="A typical answer's output tokens (e.g. an earlier audit's completion p50).",
    )
    p.add_argument(
        "--prefill-tok-s-per-gpu",
        type=_positive_float,
        metavar="R",
        help="With a features: section, the prefill rate the features' time is given at.",
    )
    p.set_defaults(func=_estimate)

    p = verbs.add_parser(
        "emulator",
        help="One SGLang-compatible emulator server (same as python -m regen.emulator).",
        description="`regen emulator --help` lists the emulator's own flags.",
        add_help=False,
    )
    p.set_defaults(func=None)


def _audit(args: argparse.Namespace) -> int:
    from rich.console import Console

    from regen.audit import run_audit, write_report
    from regen.audit.table import audit_table
    from regen.canary import stopped_run
    from regen.config import AuditConfig, load_config
    from regen.dataset.keys import AUDIT_MARKDOWN_KEY
    from regen.run import OpenedRun
    from regen.storage import open_storage

    config = load_config(args.config) if args.config else None
    audit_config = config.audit if config else AuditConfig()
    storage = open_storage(args.dataset)
    try:
        tokenizer = args.tokenizer
        if tokenizer is None and config is not None:
            # The run's own answer (regen.run.resolve_tokenizer): a remote model's files fetched.
            tokenizer = OpenedRun(config).tokenizer()
        result = run_audit(
            storage, audit_config, tokenizer_path=tokenizer, stopped=stopped_run(storage)
        )
    except UsageError:
        raise
    except UserError as err:
        # Exit 1 is a failed audit's: an audit that could not run says so with 2.
        raise UsageError(str(err)) from None
    Console().print(audit_table(result))
    # The report a reader opens is this audit's, not the run's last one. A dataset this user
    # may only read still gets its verdict and exit code; the report's absence is said.
    try:
        write_report(storage, result)
        print(f"report: {storage.uri.rstrip('/')}/{AUDIT_MARKDOWN_KEY}")
    except (OSError, UserError) as err:
        print(f"regen: warning: report/ not rewritten: {err}", file=sys.stderr)
    if result.stopped:
        # The run this dataset is from was stopped by the live gate: say which and why, as
        # the run's Failed message did, not only the checks over what it generated.
        print(f"stopped: {result.stopped}")
    print(f"verdict: {result.verdict}")
    return 1 if result.verdict == "fail" else 0


def _publish(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from regen.config import PublishConfig
    from regen.publish import default_staging, publish_dataset
    from regen.storage import open_storage

    try:
        options = PublishConfig(
            repo=args.repo,
            revision=args.revision,
            private=not args.public,
            tokenized=args.tokenized,
            license=args.license,
        )
    except ValidationError as err:
        raise ConfigError(f"regen publish: {err.errors()[0]['msg']}") from None
    flags = [
        *([f"--revision {args.revision}"] if args.revision != "main" else []),
        *(["--public"] if args.public else []),
        *(["--tokenized"] if args.tokenized else []),
        *([f"--license {args.license}"] if args.license else []),
        *(["--allow-failed"] if args.allow_failed else []),
    ]
    command = " ".join(["regen publish", args.dataset, args.repo, *flags])
    staging = args.staging or default_staging(Path(".regen"), options.target)
    try:
        published = publish_dataset(
            open_storage(args.dataset),
            options,
            staging=staging,
            command=command,
            allow_failed=args.allow_failed,
            tokenizer=args.tokenizer,
        )
    except OSError as err:  # the staging folder cannot be written, a full disk
        where = err.filename or staging
        raise UserError(f"{where}: cannot stage the repo's files ({err.strerror or err})") from None
    print("\n".join(published.lines()))
    return 0


def _status(args: argparse.Namespace) -> int:
    from regen.progress.status import read_status
    from regen.storage import open_storage

    print("\n".join(read_status(open_storage(args.dataset)).lines()))
    return 0


def _estimate(args: argparse.Namespace) -> int:
    from regen.config import load_config
    from regen.estimate import Rate, estimate, measured_rate
    from regen.storage import open_storage

    config = load_config(args.config)
    if args.mean_tokens is not None and args.mean_tokens > config.sampling.max_tokens:
        raise ConfigError(
            f"--mean-tokens {args.mean_tokens:g} is over sampling.max_tokens "
            f"{config.sampling.max_tokens:,}: no answer is longer"
        )
    if args.tok_s_per_gpu is not None:
        rate = Rate(args.tok_s_per_gpu, "given")
    else:
        try:
            rate = measured_rate(open_storage(args.rate_from))
        except UserError as err:
            raise UsageError(str(err)) from None
    found = estimate(
        config, rate, gpus=args.gpus, mean_tokens=args.mean_tokens,
        prefill_tok_s=args.prefill_tok_s_per_gpu,
    )  # fmt: skip
    print("\n".join(found.lines()))
    return 0


def _export(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from regen.config import ExportOptions
    from regen.export.exporter import export_dataset
    from regen.storage import open_storage

    try:
        options = ExportOptions(
            format=args.format,
            turns=args.turns,
            exclude_truncated=args.exclude_truncated,
            min_loss_tokens=args.min_loss_tokens,
            generated_only=args.generated_only,
            single_file=args.single_file,
            token_freq=args.token_freq,
        )
    except ValidationError as err:
        raise ConfigError(f"regen export: {err.errors()[0]['msg']}") from None
    try:
        summary = export_dataset(
            open_storage(args.dataset),
            open_storage(args.out),
            options,
            tokenizer_path=args.tokenizer,
            allow_failed=args.allow_failed,
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
    for line in summary.notes():
        print(line)
    return 0
