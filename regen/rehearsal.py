"""The configuration of a rehearsal: the real flow on a CPU, emulators in place of GPUs."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from regen.config import RegenConfig, parse_config, read_config_data
from regen.ports import free_port_range, quiet_port_range


def bundled(name: str) -> Path:
    """A file shipped in `regen/data` (the sample prompts, the emulated model)."""
    return Path(str(files("regen") / "data" / name))


def rehearsal_config(
    *,
    config_path: Path | None = None,
    prompts: str | None = None,
    out: str | None = None,
    servers: int | None = None,
    faults: list[str] | None = None,
) -> RegenConfig:
    """A user's config turned into a rehearsal, or a complete default one.

    A user's own file keeps its prompts, output, sampling and audit settings; the engine
    becomes the emulator and the model the bundled emulated one (same served name), so the
    rehearsal tests the config the GPU run will use without copying real weights.
    """
    data: dict[str, Any] = read_config_data(config_path) if config_path else {}
    data.setdefault("prompts", str(bundled("sample_prompts.jsonl")))
    data.setdefault("output", "out/rehearsal")
    if prompts:
        data["prompts"] = prompts
    if out:
        data["output"] = out
    work_dir = Path(data.get("work_dir", ".regen"))
    # The real model stays where it is: a rehearsal stages the emulated one under its name.
    saved_model = data.get("model")
    model: dict[str, Any] = saved_model if isinstance(saved_model, dict) else {}
    name = str(model.get("served_name", "qwen3-emu"))
    data["model"] = {
        "source": str(bundled("emulator-model")),
        "served_name": name,
        "stage_dir": str(work_dir / "stage" / name),
    }

    engine = data.setdefault("engine", {})
    if not isinstance(engine, dict):
        return parse_config(data, str(config_path or "rehearsal"))
    # One emulator per configured GPU, so a rehearsal of a 7-GPU config runs 7 servers.
    gpus = engine.get("gpus")
    count = servers or (len(gpus) if isinstance(gpus, list) and gpus else 4)
    engine["kind"] = "emulator"
    engine["gpus"] = list(range(count))
    engine.setdefault("startup_timeout_s", 60)
    start = int(engine.get("base_port", 0))
    engine["base_port"] = free_port_range(count, start) if start else quiet_port_range(count)
    for gpu_only in ("python", "urls", "launcher"):  # the emulator runs in this interpreter
        engine.pop(gpu_only, None)
    emulator = engine.setdefault("emulator", {})
    if isinstance(emulator, dict):
        emulator["faults"] = [*emulator.get("faults", []), *(faults or [])]
    return parse_config(data, str(config_path or "rehearsal"))
