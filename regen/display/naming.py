"""What a run and its dataset are called where people look for them: run names, tags, keys.

A multi-day run is found in the Prefect UI by what it does (rehearsal or GPU node, model,
dataset), and each dataset's reports by a key of its own, so this module turns a config into
those names. Prefect's artifact keys allow lowercase letters, digits and dashes only.
"""

from __future__ import annotations

import re
import socket
from pathlib import PurePosixPath
from urllib.parse import quote

from regen.config import RegenConfig
from regen.dataset.keys import (
    CANARY_PREFIX,
    REPORT_PREFIX,
    RUN_KEY,
    STOP_KEY,
    key_url,
    progress_key,
)

_NOT_KEY = re.compile(r"[^a-z0-9]+")
_MAX_SLUG = 48


def slugify(text: str) -> str:
    """Lowercase letters, digits and single dashes; `dataset` if nothing is left."""
    return _NOT_KEY.sub("-", text.lower()).strip("-") or "dataset"


def dataset_slug(output: str) -> str:
    """The dataset's key: its last two path segments, as in `regen-qwen3-6-27b`.

    Two segments tell apart the usual `out/<name>` and `s3://bucket/<project>/<name>` layouts
    without the noise of a whole absolute path; the tail is kept when it is too long.
    """
    path = output.removeprefix("s3://").rstrip("/")
    parts = [p for p in PurePosixPath(path).parts if p not in {"/", ".", ".."}]
    return slugify("-".join(parts[-2:]))[-_MAX_SLUG:].strip("-") or "dataset"


def dataset_name(output: str) -> str:
    """The dataset's own folder name, as a user calls it (`rehearsal-nightly`)."""
    return PurePosixPath(output.removeprefix("s3://").rstrip("/")).name or output


def artifact_key(kind: str, output: str) -> str:
    """`<kind>-<dataset slug>`: each dataset's latest report is found under its own key."""
    return f"{kind}-{dataset_slug(output)}"


def artifact(kind: str, output: str, description: str) -> dict[str, str]:
    """The `key` and `description` of a dataset's artifact, as Prefect's `create_*_artifact`
    take them. A card shows about 50 characters of its description, so the description leads
    with its figure (`82 % · ETA 00:55 UTC (24 s) · …`); the dataset's name closes it (the
    key, the card's title, holds the dataset's slug already)."""
    return {"key": artifact_key(kind, output), "description": described(description, output)}


def described(description: str, output: str) -> str:
    """An artifact's description: its figure first, then the dataset's name."""
    return f"{description} · {dataset_name(output)}"


def node_name(node: str | None = None) -> str:
    """The node a run works on: its multi-node name, or this machine's host name."""
    return slugify(node or socket.gethostname().split(".")[0])


def _prompts_name(prompts: str) -> str:
    name = PurePosixPath(prompts.removeprefix("s3://")).name
    return slugify(name.split(".")[0]) if name else "prompts"


def run_name(config: RegenConfig, node: str | None = None) -> str:
    """`rehearsal-<model>-<prompts>` on emulators, `<node>-<model>-<prompts>` on GPUs; a
    rehearsal with faults is named for them (`…-prompts6k-empty-answer-0-87`), so a clean and
    a fault run of one prompts file are told apart in the runs list."""
    head = "rehearsal" if config.engine.kind == "emulator" else node_name(node)
    name = f"{head}-{slugify(config.model.served_name)}-{_prompts_name(config.prompts)}"
    faults = _faults(config)
    # Prefect shows long names whole, but a runs list reads the head: a cap keeps it a name.
    return f"{name}-{slugify('-'.join(faults))[:60].strip('-')}" if faults else name


def _faults(config: RegenConfig) -> list[str]:
    """The rehearsal's injected faults, those of one server named for it (`server-2:...`)."""
    if config.engine.kind != "emulator":
        return []
    emulator = config.engine.emulator
    by_server = sorted(emulator.server_faults.items())
    return [*emulator.faults, *(f"server-{i}:{f}" for i, fs in by_server for f in fs)]


def run_tags(config: RegenConfig, *nodes: str) -> list[str]:
    """`rehearsal` or `gpu`, the model, the dataset, and each node (this host if none given)."""
    return [
        "rehearsal" if config.engine.kind == "emulator" else "gpu",
        f"model:{config.model.served_name}",
        f"dataset:{dataset_name(config.output)}",
        *(f"node:{node_name(n)}" for n in (nodes or (None,))),
        *(f"fault:{f}" for f in _faults(config)),
    ]


def s3_console_url(uri: str) -> str | None:
    """The AWS console page of an `s3://bucket/prefix` folder; None for a local path."""
    if not uri.startswith("s3://"):
        return None
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    url = f"https://s3.console.aws.amazon.com/s3/buckets/{quote(bucket)}"
    return f"{url}?prefix={quote(prefix + '/')}" if prefix else url


def dataset_markdown(uri: str, summary: str, *, stopped: bool = False) -> str:
    """Where a run's data is: the first thing a user watching the run wants to open; for a
    run the live gate `stopped`, where it says why and where the canary's rows wait; then how
    the trainers get it (`regen export`, and what a trainer reads)."""
    root = uri.rstrip("/")
    # The dataset's sibling: never inside it, where a later run's listing would find it.
    tokenized = f"{root}-export/tokenized"
    lines = [
        f"**Dataset `{dataset_name(uri)}`**: {summary}",
        "",
        f"- output: `{root}`",
        f"- report folder: `{key_url(root, REPORT_PREFIX)}` (audit.md, audit.json, fleet.json, "
        "plots)",
        f"- run description: `{key_url(root, RUN_KEY)}`",
        f"- progress: `{key_url(root, progress_key())}`",
    ]
    if stopped:
        lines += [
            f"- why the live gate stopped the run: `{key_url(root, STOP_KEY)}`",
            f"- the canary's rows (generated, not committed): `{key_url(root, CANARY_PREFIX)}`",
        ]
    console = s3_console_url(root)
    if console:
        lines.append(f"- S3 console: [{root}/]({console})")
    lines += [
        "",
        "**For the trainers** (after a passing audit; `regen export --help` lists the formats):",
        "",
        "```",
        f"regen export {root} -f tokenized --single-file -o {tokenized}",
        "```",
        "",
        f"SpecForge: `data.prompts_path={tokenized}/tokenized.jsonl` (the server's own tokens "
        "and loss mask); speculators: `-f hf-dataset --token-freq`, then "
        "`datasets.load_from_disk` on its folder.",
    ]
    return "\n".join(lines) + "\n"
