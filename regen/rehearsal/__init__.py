"""The configuration of a rehearsal: the real flow on a CPU, emulators in place of GPUs.

A rehearsal of a user's config first validates that config exactly as `regen run` would, so
a mistake in it fails here with the same line and exit code; only then are the engine and
the model swapped for the emulator. It never writes where the GPU run will: its dataset goes
to a location of its own, derived from the config (or `--out`), and the config's `output`
and `export.dest` are left untouched, so the GPU run finds them as they were.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from regen.config import RegenConfig, parse_config, read_config_data
from regen.display.naming import dataset_slug, slugify
from regen.errors import ConfigError
from regen.rehearsal.dress import DressPlan, dress, rehearsal_ports

# Where a rehearsal without a config writes; one with a config writes under its work_dir.
DEFAULT_OUTPUT = "out/rehearsal"


def bundled(name: str) -> Path:
    """A file shipped in `regen/data` (the sample prompts, the emulated model)."""
    return Path(str(files("regen") / "data" / name))


def is_rehearsal_model(source: str) -> bool:
    """Whether `source` is the emulated model a rehearsal serves (a run.json that names it
    was made by a rehearsal)."""
    return source.rstrip("/") == str(bundled("emulator-model"))


@dataclass(frozen=True)
class Rehearsal:
    """`config` is what runs (emulators, the bundled model, the rehearsal's own output);
    `source` is the user's config as `regen run` would take it, None without a config file."""

    config: RegenConfig
    source: RegenConfig | None
    dress: DressPlan | None = None
    """Set for a dress rehearsal (`engine_kind="sglang"`): the twin to build before the run."""


def plan_rehearsal(
    *,
    config_path: Path | None = None,
    prompts: str | None = None,
    out: str | None = None,
    servers: int | None = None,
    faults: list[str] | None = None,
    engine_kind: str = "emulator",
    engine_python: str | None = None,
    sample: int | None = None,
) -> Rehearsal:
    """A user's config validated as is, then turned into a rehearsal; or a default one.

    `engine_kind="sglang"` is a dress rehearsal (regen.rehearsal.dress): the real SGLang server
    on this CPU (`engine_python`'s, default the config's engine.python) serving a tiny twin of
    the model, over the first `sample` prompts; its dataset gets a `-sglang` suffix, so it never
    resumes an emulator rehearsal's.

    A user's own file keeps its prompts, sampling and audit settings; the engine becomes the
    emulator and the model the bundled emulated one (same served name), so the rehearsal
    tests the config the GPU run will use without copying real weights. What the file leaves
    out that a run needs (model, prompts, output) is the rehearsal's: a partial file is a
    rehearsal's settings, not a mistake, and its `export.dest` is the rehearsal's too.
    Raises ConfigError (exit 2) for a mistake in the file.
    """
    name = str(config_path or "rehearsal")
    data: dict[str, Any] = read_config_data(config_path) if config_path else {}
    if prompts:
        data["prompts"] = prompts
    data.setdefault("prompts", str(bundled("sample_prompts.jsonl")))
    real_output = data.get("output") if config_path else None
    data.setdefault("model", {"source": str(bundled("emulator-model")), "served_name": "qwen3-emu"})
    data.setdefault("output", out or DEFAULT_OUTPUT)
    # As `regen run --config` validates it: a wrong type, an unknown key, a bad value fails
    # before anything is replaced, with the line `regen check` prints.
    source = parse_config(copy.deepcopy(data), name)
    faults = [*source.engine.emulator.faults, *(faults or [])]
    output = rehearsal_output(source, real_output if isinstance(real_output, str) else None)
    if out:
        if real_output is not None and _same_place(out, source.output):
            raise ConfigError(
                f"--out {out} is the output of {name}: a rehearsal never writes where the GPU "
                "run will; give another --out"
            )
        output = out
    elif engine_kind == "sglang":
        output = f"{output}-sglang"
    elif faults:
        # Another fault is another experiment: it never resumes a clean rehearsal's dataset
        # (which would pass with nothing generated) nor a stopped one's.
        output = f"{output}-{slugify('-'.join(faults))[:40].strip('-')}"
    data["output"] = output
    if real_output is not None and isinstance(data.get("export"), dict):
        # The GPU run's export destination is its output's sibling: a config that names an
        # output names a real run, and neither is the rehearsal's to write.
        data["export"]["dest"] = f"{output.rstrip('/')}-export"

    if engine_kind == "sglang":
        plan = dress(data, source, servers=servers, engine_python=engine_python, sample=sample)
        return Rehearsal(
            config=parse_config(data, name),
            source=source if config_path is not None else None,
            dress=plan,
        )
    work_dir = source.work_dir
    # The real model stays where it is: a rehearsal stages the emulated one under its name.
    served = source.model.served_name
    data["model"] = {
        "source": str(bundled("emulator-model")),
        "served_name": served,
        "stage_dir": str(work_dir / "stage" / served),
    }
    engine: dict[str, Any] = data.setdefault("engine", {})
    # One emulator per configured GPU, so a rehearsal of a 7-GPU config runs 7 servers.
    gpus = engine.get("gpus")
    count = servers or (len(gpus) if isinstance(gpus, list) and gpus else 4)
    engine["kind"] = "emulator"
    engine["gpus"] = list(range(count))
    engine.setdefault("startup_timeout_s", 60)
    engine["base_port"] = rehearsal_ports(engine, count)
    for gpu_only in ("python", "urls", "launcher"):  # the emulator runs in this interpreter
        engine.pop(gpu_only, None)
    emulator = engine.setdefault("emulator", {})
    emulator["faults"] = faults
    return Rehearsal(
        config=parse_config(data, name), source=source if config_path is not None else None
    )


def rehearsal_config(
    *,
    config_path: Path | None = None,
    prompts: str | None = None,
    out: str | None = None,
    servers: int | None = None,
    faults: list[str] | None = None,
) -> RegenConfig:
    """The config a rehearsal runs (see `plan_rehearsal`)."""
    return plan_rehearsal(
        config_path=config_path, prompts=prompts, out=out, servers=servers, faults=faults
    ).config


def rehearsal_output(source: RegenConfig, real_output: str | None) -> str:
    """A rehearsal's own dataset root: `<work_dir>/rehearsal/<dataset slug>` for a config
    that names an output (local, whatever the output is, so an S3 prefix stays empty), else
    `out/rehearsal`."""
    if real_output is None:
        return DEFAULT_OUTPUT
    return str(source.work_dir / "rehearsal" / dataset_slug(real_output))


def _same_place(a: str, b: str) -> bool:
    if a.startswith("s3://") or b.startswith("s3://"):
        return a.rstrip("/") == b.rstrip("/")
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
