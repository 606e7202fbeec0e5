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
    take them: every description starts with the dataset's name, for the artifacts page."""
    return {
        "key": artifact_key(kind, output),
        "description": f"{dataset_name(output)}: {description}",
    }


def node_name(node: str | None = None) -> str:
    """The node a run works on: its multi-node name, or this machine's host name."""
    return slugify(node or socket.gethostname().split(".")[0])


def _prompts_name(prompts: str) -> str:
    name = PurePosixPath(prompts.removeprefix("s3://")).name
    return slugify(name.split(".")[0]) if name else "prompts"


def run_name(config: RegenConfig, node: str | None = None) -> str:
    """`rehearsal-<model>-<prompts>` on emulators, `<node>-<model>-<prompts>` on GPUs."""
    head = "rehearsal" if config.engine.kind == "emulator" else node_name(node)
    return f"{head}-{slugify(config.model.served_name)}-{_prompts_name(config.prompts)}"


def run_tags(config: RegenConfig, *nodes: str) -> list[str]:
    """`rehearsal` or `gpu`, the model, the dataset, and each node (this host if none given)."""
    return [
        "rehearsal" if config.engine.kind == "emulator" else "gpu",
        f"model:{config.model.served_name}",
        f"dataset:{dataset_name(config.output)}",
        *(f"node:{node_name(n)}" for n in (nodes or (None,))),
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
    run the live gate `stopped`, where it says why and where the canary's rows wait."""
    root = uri.rstrip("/")
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
    return "\n".join(lines) + "\n"
