"""The dress rehearsal: the whole flow on the real SGLang server on this CPU, serving a tiny twin
of the configured model (regen.rehearsal.twin), before a GPU node is rented.

An emulator rehearsal proves the config, the storage and the flow; it cannot prove that the
model's own chat template renders in SGLang's transformers, that the tokenizer's think tags
reach the reasoning parser, or that the launch flags start a real server. The dress rehearsal
does, with the model's tokenizer files, the config's reasoning parser and its launch flags (less
those that need a GPU, dropped and listed), on `engine.device: cpu`. What it cannot do is judge
the text: the twin's weights are random, so every check of the answers' quality is measured but
not judged (audit.not_judged), and the output says so.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.audit.registry import CHECKS
from regen.config import RegenConfig
from regen.errors import UserError
from regen.machine.ports import free_port_range, quiet_port_range
from regen.rehearsal.twin import TOKENIZER_FILES, build_twin

# Launch flags that only mean something on a GPU (or would override the CPU path regen sets):
# each is dropped with its values, and listed. A prefix matches the flag and its longer forms.
GPU_ONLY = (
    "--cuda-graph", "--disable-cuda-graph", "--enable-torch-compile", "--torch-compile",
    "--quantization", "--kv-cache-dtype", "--attention-backend", "--prefill-attention-backend",
    "--decode-attention-backend", "--sampling-backend", "--tp-size", "--tensor-parallel",
    "--dp-size", "--data-parallel", "--ep-size", "--expert-parallel", "--enable-dp-attention",
    "--moe-", "--enable-deepep", "--deepep", "--enable-nccl", "--enable-flashinfer",
    "--device", "--speculative-", "--max-total-tokens", "--json-model-override-args",
    "--cpu-offload-gb", "--enable-two-batch-overlap", "--enable-hierarchical-cache",
    "--base-gpu-id", "--gpu-id-step",
)  # fmt: skip
# Every check of what the answers say: random weights fail them by design.
NOT_JUDGED = [check.name for check in CHECKS if check.reads_answers]
DEFAULT_SERVERS = 2  # each CPU server holds about 1.9 GB of RAM, whatever the model
DEFAULT_SAMPLE = 200  # prompts from the head of the set: minutes on a CPU, not days
MAX_TOKENS = 64  # the planted answer is about 20 tokens; random text runs to the cap


@dataclass(frozen=True)
class DressPlan:
    """What a dress rehearsal changes of the user's config, and where it builds the twin."""

    origin: RegenConfig
    """The user's config as `regen run` takes it (the prompts and input the sample is read by)."""
    twin_of: str
    """Where the tokenizer comes from: model.tokenizer_path or model.source."""
    revision: str | None
    twin_dir: Path
    sample: Path
    sample_size: int
    prompts: str
    changes: list[str] = field(default_factory=list)
    """What differs from the GPU run, one phrase each (dropped flags, capped settings)."""

    def notice(self) -> list[str]:
        """The lines a user reads before the run starts."""
        return [
            f"dress rehearsal: the real SGLang on this CPU serves a tiny twin of {self.twin_of} "
            f"(its tokenizer and chat template, random weights) at {self.twin_dir}",
            "dress rehearsal: the text is random: not judged here: " + ", ".join(NOT_JUDGED),
            f"dress rehearsal: {self.sample_size} prompts from the head of {self.prompts}",
            *(f"dress rehearsal: {change}" for change in self.changes),
        ]


def rehearsal_ports(engine: dict[str, Any], count: int) -> int:
    """A free base port for a rehearsal's `count` servers: from the config's base_port when it
    names one, else a quiet range (the GPU node's ports may be taken on this machine)."""
    start = int(engine.get("base_port", 0))
    return free_port_range(count, start) if start else quiet_port_range(count)


def split_gpu_flags(extra_args: list[str]) -> tuple[list[str], list[str]]:
    """(kept, dropped) of engine.extra_args: a GPU-only flag goes with the values after it."""
    kept: list[str] = []
    dropped: list[str] = []
    dropping = False
    for arg in extra_args:
        if arg.startswith("--"):
            dropping = arg.split("=", 1)[0].startswith(GPU_ONLY)
        (dropped if dropping else kept).append(arg)
    return kept, dropped


def dress(
    data: dict[str, Any],
    source: RegenConfig,
    *,
    servers: int | None,
    engine_python: str | None,
    sample: int | None,
) -> DressPlan:
    """Turn a rehearsal's config data (already validated as `source`) into a dress rehearsal's:
    the twin as the model, the real engine on the CPU, a sample of the prompts, random text
    not judged. Changes `data` in place; the twin is built by `prepare`."""
    work = source.work_dir / "rehearsal"
    served = source.model.served_name
    plan = DressPlan(
        origin=source,
        twin_of=str(source.model.tokenizer_path or source.model.source),
        revision=None if source.model.tokenizer_path else source.model.revision,
        twin_dir=work / "twin" / served,
        sample=work / "twin" / f"{served}-prompts.jsonl",
        sample_size=sample or DEFAULT_SAMPLE,
        prompts=source.prompts,
    )
    data["model"] = {
        "source": str(plan.twin_dir),
        "served_name": served,
        "stage_dir": str(source.work_dir / "stage" / f"{served}-twin"),
    }
    data["prompts"] = str(plan.sample)
    engine: dict[str, Any] = data.setdefault("engine", {})
    for gpu_only in ("gpus", "urls", "launcher", "emulator"):
        engine.pop(gpu_only, None)
    kept, dropped = split_gpu_flags(source.engine.extra_args)
    if dropped:
        plan.changes.append(f"GPU-only launch flags dropped: {' '.join(dropped)}")
    if source.engine.speculative.enabled:
        plan.changes.append(
            f"speculative decoding off ({source.engine.speculative.algorithm}: the twin has "
            "no draft head)"
        )
    if source.engine.deterministic:
        plan.changes.append(
            "deterministic inference off (SGLang 0.5.23 has none on a CPU: seeds are sent, "
            "not honoured)"
        )
    count = servers or DEFAULT_SERVERS
    engine.update(
        kind="sglang",
        deterministic=False,
        device="cpu",
        servers=count,
        base_port=rehearsal_ports(engine, count),
        python=engine_python or source.engine.python,
        extra_args=kept,
        speculative={"enabled": False},
    )
    engine.setdefault("startup_timeout_s", 300)
    sampling = data.setdefault("sampling", {})
    if source.sampling.max_tokens > MAX_TOKENS:
        plan.changes.append(f"sampling.max_tokens {source.sampling.max_tokens} -> {MAX_TOKENS}")
        sampling["max_tokens"] = MAX_TOKENS
    audit = data.setdefault("audit", {})
    audit["not_judged"] = sorted({*source.audit.not_judged, *NOT_JUDGED})
    return plan


def prepare(plan: DressPlan, hf_token: str | None = None) -> None:
    """Fetch the model's tokenizer files (a directory, S3 or the Hub: no weights), build the
    twin over them, and write the prompt sample."""
    from regen.prompts.load import load_prompts, read_options

    source = plan.origin
    tokenizer = plan.twin_dir.parent / f".{plan.twin_dir.name}-tokenizer"
    fetch_tokenizer(plan.twin_of, plan.revision, tokenizer, hf_token)
    # With features, deep enough for their layers: EAGLE-3's default needs 8, explicit ids
    # one more than the deepest (its output is an aux state, the last layer's is not).
    features = source.features
    layers = 2 if features is None else max(8, max(features.layer_ids or [0]) + 2)
    build_twin(
        tokenizer, plan.twin_dir, context_length=source.engine.context_length, layers=layers
    )
    prompts = load_prompts(source.prompts, options=read_options(source.input, hf_token))
    # The rows as read (tools, calls and results included), which the sample reads back as is.
    head = prompts.valid.head(plan.sample_size).select("id", "messages", "tools")
    plan.sample.parent.mkdir(parents=True, exist_ok=True)
    head.write_ndjson(plan.sample)
    if not head.height:
        raise UserError(f"{source.prompts}: no valid prompt to rehearse with")


def fetch_tokenizer(where: str, revision: str | None, target: Path, hf_token: str | None) -> Path:
    """The tokenizer files of a model directory, S3 prefix or Hub repo, copied into `target`."""
    from regen.staging.sources import open_source

    model = open_source(where, revision, hf_token)
    files = [f for f in model.list_files() if f.name in TOKENIZER_FILES]
    if not any(f.name == "tokenizer.json" for f in files):
        raise UserError(f"{where}: no tokenizer.json to build the twin of the model with")
    target.mkdir(parents=True, exist_ok=True)

    def place(file: Any, part: Path) -> None:
        shutil.move(part, target / file.name)

    model.copy(files, target, workers=4, progress=lambda _: None, place=place)
    return target
