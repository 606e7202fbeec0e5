"""`regen`: the command line (the console script). Each verb is thin: the work is in the
library and the flows.

This module builds the one parser. The verbs that run a flow or touch the flows or Prefect
(rehearse, run, check, blocks, notify) are here, above the library; `regen.cli.add_library_verbs`
adds the others to it, as regen/ may not import upwards. Prefect is imported only by the
verbs that run a flow, so `regen emulator` and `regen --help` start fast and a config error
is reported before Prefect loads.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from regen.cli import add_config, add_library_verbs, positive_int
from regen.errors import ConfigError, UserError

if TYPE_CHECKING:
    from regen.config import RegenConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="regen",
        description="Regenerate a prompt set with a target model on a fleet of SGLang servers.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    p = verbs.add_parser(
        "rehearse",
        help="Run the whole flow on this CPU against emulated SGLang servers.",
        description="The real flow, config, storage and Prefect states, with emulators for "
        "GPUs. With --config, the file is first validated as `regen run` would (a mistake "
        "exits 2 with the line `regen check` prints; the launch flags are checked), the GPU "
        "node's facts are listed as `not checked here`, then the engine and model become the "
        "emulator. A rehearsal never writes into the config's output: its dataset goes to "
        "<work_dir>/rehearsal/<dataset> (out/rehearsal without a config, with a suffix per "
        "--emu-fault), or --out.",
    )
    add_config(p, required=False)
    p.add_argument("--prompts", help="JSONL/Parquet prompts (default: the bundled sample set).")
    p.add_argument(
        "--out",
        help="The rehearsal's dataset root, a directory or s3://bucket/prefix (never the "
        "config's output).",
    )
    p.add_argument("--servers", type=positive_int, help="Number of emulator servers (default 4).")
    p.add_argument(
        "--emu-fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="Fault injected into every emulator, e.g. empty-answer=0.87 (repeatable).",
    )
    p.add_argument(
        "--engine",
        choices=["emulator", "sglang"],
        default="emulator",
        help="sglang: a dress rehearsal on the real SGLang server on this CPU, serving a tiny "
        "twin of the configured model (its tokenizer and chat template, random weights) with "
        "the config's reasoning parser and launch flags (GPU-only flags dropped and listed), "
        "over the first --sample prompts; the text is random, so its quality is not judged. "
        "Default 2 servers; dataset <work_dir>/rehearsal/<dataset>-sglang.",
    )
    p.add_argument(
        "--engine-python",
        help="With --engine sglang: the interpreter of a venv whose sglang serves on a CPU "
        "(`make engine-env` builds .venv-sglang); default the config's engine.python.",
    )
    p.add_argument(
        "--sample",
        type=positive_int,
        help="With --engine sglang: how many prompts from the head of the set (default 200).",
    )
    p.set_defaults(func=_rehearse)

    p = verbs.add_parser(
        "run",
        help="Run the flow on this node's GPUs (engine.kind: sglang).",
        description="The whole run on this node: provisioning checks, model staging, the "
        "fleet (one SGLang server per engine.gpus entry), sharded generation into `output` "
        "(resumed where it stopped), the audit and, with an export: section, the trainer "
        "files. Exit 0 when the audit passes or warns, 1 when the run or its audit fails, 2 "
        "for a config mistake.",
    )
    add_config(p, required=True)
    p.set_defaults(func=_run)

    p = verbs.add_parser(
        "check",
        help="Provisioning checks only: a table, exit 1 on failure.",
        description="Every provisioning check of `regen run`, without staging or launching "
        "anything: the config, the launch flags (sglang's own parser when engine.python has "
        "it), the code, the model directory, the prompts, the output (writable, and not "
        "another run's or a rehearsal's dataset), the engine, the GPUs (NVML: `make nvidia` "
        "installs it), the ports, the stage dir and memory. Exit 1 on a failed row, 2 for a "
        "config mistake.",
    )
    add_config(p, required=True)
    p.set_defaults(func=_check)

    p = verbs.add_parser(
        "features",
        help="Capture the target's hidden states over a dataset regen wrote (stage 7).",
        description="For every committed shard of the config's output without features yet: "
        "launch the fleet with the capture flags (the features: section's convention and "
        "layers, regen's capture module), send a prefill over each sample's stored token ids "
        "and commit one feature shard per dataset shard (manifest last) under features/ (or "
        "features.dest). Rerun to resume. Exit 1 when a shard could not be captured.",
    )
    add_config(p, required=True)
    p.set_defaults(func=_features)

    p = verbs.add_parser(
        "features-export",
        help="Write a dataset's feature shards in a trainer's offline layout.",
        description="specforge: one .ckpt per sample (input_ids, loss_mask, hidden_state, "
        "aux_hidden_state), the directory SpecForge's offline reader takes; speculators: an "
        "Arrow dataset plus hidden_states/hs_<i>.safetensors, the directory its --data takes "
        "(--model: the model directory, for the final norm's weight).",
    )
    p.add_argument("features", help="The root holding features/ (the dataset or features.dest).")
    p.add_argument("--layout", choices=["specforge", "speculators"], required=True)
    p.add_argument("--out", required=True, help="A local directory to write.")
    p.add_argument("--model", help="The model directory (speculators: the final norm weight).")
    p.set_defaults(func=_features_export)

    add_library_verbs(verbs)

    p = verbs.add_parser(
        "blocks",
        help="Prefect blocks: register the block types.",
        description="Register regen's block types (FleetConfig, ModelSource) and prefect-aws's "
        "(AwsCredentials, S3Bucket) with the Prefect server PREFECT_API_URL names; refused "
        "when it is unset or unreachable, since the blocks would go to a temporary server.",
    )
    p.add_argument("action", choices=["register"], help="register: make the blocks known.")
    p.set_defaults(func=_blocks)

    p = verbs.add_parser(
        "notify",
        help="Tell people how runs end: Prefect automations sending to a notification block.",
        description="setup: create (or replace) the automations on the Prefect server "
        "PREFECT_API_URL names that send a run's one line to the notification block --block "
        "(Slack webhook, custom webhook, email...; create it first) when a run of regen's "
        "flows ends: done (Completed: rows committed, verdict, where it went), stopped by the "
        "live gate, failed, or crashed (where its committed shards are, how to resume). "
        "--deployment narrows them to named deployments.",
    )
    p.add_argument("action", choices=["setup"], help="setup: create the automations.")
    p.add_argument(
        "--block",
        required=True,
        metavar="NAME",
        help="The notification block's name (SLUG/NAME when several types have one).",
    )
    p.add_argument(
        "--deployment",
        action="append",
        default=[],
        metavar="FLOW/NAME",
        help="Only this deployment's runs (repeatable; default every regen run).",
    )
    p.set_defaults(func=_notify)
    return parser


def prefect_env() -> None:
    """Prefect's settings for a command-line run, set before Prefect is imported."""
    # No network here or on many GPU nodes: Prefect's telemetry would only log an error.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The ephemeral API server's first start sets up its database: slow on a busy laptop.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _rehearse(args: argparse.Namespace) -> int:
    from regen.rehearsal import plan_rehearsal

    if args.engine != "sglang" and (args.engine_python or args.sample):
        raise ConfigError("--engine-python and --sample are for --engine sglang")
    if args.engine == "sglang" and args.emu_fault:
        raise ConfigError("--emu-fault injects faults into emulators; --engine sglang runs none")
    rehearsal = plan_rehearsal(
        config_path=args.config,
        prompts=args.prompts,
        out=args.out,
        servers=args.servers,
        faults=args.emu_fault,
        engine_kind=args.engine,
        engine_python=args.engine_python,
        sample=args.sample,
    )
    output = rehearsal.config.output
    if rehearsal.source is not None:
        from regen.preflight import print_report, rehearsal_checks

        report = rehearsal_checks(rehearsal.source, output)
        print_report(
            report,
            title=f"regen provisioning checks of {args.config} (the GPU run's own)",
            verdict=f"provisioning of {args.config} (as far as this machine sees)",
        )
        if not report.ok:
            return 1
        print(f"rehearsal: writing to {output}; {rehearsal.source.output} is not touched")
    else:
        print(f"rehearsal: writing to {output}")
    if rehearsal.dress is not None:
        from regen.rehearsal.dress import prepare

        prepare(rehearsal.dress)
        print("\n".join(rehearsal.dress.notice()), flush=True)
    return _run_flow(rehearsal.config)


def _run(args: argparse.Namespace) -> int:
    from regen.config import load_config

    return _run_flow(load_config(args.config))


def _features(args: argparse.Namespace) -> int:
    from regen.config import load_config

    config = load_config(args.config)
    if config.features is None:
        raise ConfigError(f"{args.config}: regen features needs a features: section")
    prefect_env()
    from flows.runner import run_features

    return run_features(config)


def _features_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from regen.features.layouts import write_layout
    from regen.storage import open_storage

    model = Path(args.model) if args.model else None
    counts = write_layout(open_storage(args.features), Path(args.out), args.layout, model)
    print(f"features-export: {counts.samples:,} samples of {counts.shards:,} shards as "
          f"{counts.layout} in {counts.dest}")  # fmt: skip
    return 0


def _check(args: argparse.Namespace) -> int:
    """The provisioning checks over every code package of the product, as the flow runs them."""
    from flows import CODE_PACKAGES
    from regen.config import load_config
    from regen.preflight import print_report, run_checks

    report = run_checks(load_config(args.config), packages=CODE_PACKAGES)
    print_report(report)
    return 0 if report.ok else 1


def _run_flow(config: RegenConfig) -> int:
    prefect_env()
    from flows.runner import run_regenerate

    return run_regenerate(config)


def _blocks(args: argparse.Namespace) -> int:
    prefect_env()
    from blocks import register_blocks, require_api

    require_api()

    for name in register_blocks():
        print(f"registered block type {name}")
    return 0


def _notify(args: argparse.Namespace) -> int:
    prefect_env()
    from blocks import require_api
    from flows.notify import setup_notifications

    require_api()
    for name, ident in setup_notifications(args.block, args.deployment):
        print(f"automation {name!r} ({ident})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `regen` console script; user errors are one line, exit 1 or 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "emulator":
        from regen.emulator import main as emulator_main

        return emulator_main(argv[1:])
    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UserError as err:
        print(f"regen: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(
            "regen: interrupted; the fleet was stopped and committed shards are kept.",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
