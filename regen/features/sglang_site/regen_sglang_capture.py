"""regen's capture module for SGLang 0.5.23 (and no other version): a request's hidden states
go to a file, not through JSON.

Stock 0.5.23 turns every captured value into a Python float in the scheduler
(`req_hidden_states.cpu().clone().tolist()`,
srt/managers/scheduler_components/batch_result_processor.py:659), pickles the lists to the
tokenizer manager and writes them as JSON text: about 25 million Python floats for one
2,000-token sample of an 8B target. It also drops a request's middle prefill chunks (`store`
is false while `req.inflight_middle_chunks > 0`, same file :309-336) and returns only
`hidden_states[:finished_len]` (scheduler_components/output_streamer.py:668-672), so a
prefill-only request (`max_new_tokens: 0`) gets none and a sample longer than
`--chunked-prefill-size` loses its head. And it returns only the auxiliary layers: the final
hidden state that EAGLE-3's offline target needs (`logits_output.last_hidden_states`, kept
by srt/layers/logits_processor.py:905-915 under aux capture) never leaves the scheduler.

This module replaces one method, `SchedulerBatchResultProcessor._append_prefill_hidden_states`
(:641), for requests with `return_hidden_states: true` under full capture: each prefill chunk's
rows are kept as tensors (middle chunks included), and when the last chunk is in, the
request's `input_ids`, `aux_hidden_state` [tokens, layers x hidden] and `hidden_state`
[tokens, hidden] (the model's dtype) are written with safetensors to
`$REGEN_CAPTURE_DIR/<key>.safetensors` (a temp name renamed, so a reader never sees half a
file), and the key stands in the response's `meta_info.hidden_states` as `["regen:<key>"]`.
A request asks `max_new_tokens: 1` (0 would cut the key with the rest). The client
(regen.features.capture) reads the file, checks its ids against the ones it sent, and
deletes it.

Loaded by this directory's sitecustomize through an import hook, in every process of the
server (SGLang spawns its scheduler); it imports nothing from regen, which the server's venv
does not have. On another SGLang version it refuses to patch and the scheduler fails at
import with a line that says so: a server that silently returned JSON would cost the GPUs the
17x that this module exists to avoid.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import uuid
from typing import Any

PINNED = "0.5.23"
TARGET = "sglang.srt.managers.scheduler_components.batch_result_processor"
KEY_PREFIX = "regen:"


def arm() -> None:
    """Patch TARGET when it is imported (or now, if it already is)."""
    if TARGET in sys.modules:
        patch(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        patch(module)


def patch(module: Any) -> None:
    from sglang.version import __version__

    if __version__ != PINNED:
        raise RuntimeError(
            f"regen's capture module is pinned to sglang {PINNED}, this server has "
            f"{__version__}: run regen features with sglang=={PINNED}"
        )
    cls = module.SchedulerBatchResultProcessor
    original = cls._append_prefill_hidden_states
    if getattr(original, "_regen_capture", False):
        return
    directory = os.environ["REGEN_CAPTURE_DIR"]
    os.makedirs(directory, exist_ok=True)
    # A request's middle prefill chunks until its last one; one processor per scheduler
    # process, and the processor's class has __slots__, so the dict lives here.
    chunks: dict[str, list[tuple[Any, Any]]] = {}

    def _append_prefill_hidden_states(
        self: Any,
        *,
        req: Any,
        logits_output: Any,
        hidden_state_offset: int,
        capture_hidden_mode: Any,
        extend_input_len: int,
        store: bool = True,
    ) -> int:
        if req.return_hidden_states is not True or not capture_hidden_mode.is_full():
            return original(
                self, req=req, logits_output=logits_output,
                hidden_state_offset=hidden_state_offset,
                capture_hidden_mode=capture_hidden_mode, extend_input_len=extend_input_len,
                store=store,
            )  # fmt: skip
        start, end = hidden_state_offset, hidden_state_offset + extend_input_len
        last = logits_output.last_hidden_states
        rows = (
            logits_output.hidden_states[start:end].cpu().clone(),
            None if last is None else last[start:end].cpu().clone(),
        )
        if req.inflight_middle_chunks > 0:  # a middle chunk: keep it for the last one
            chunks.setdefault(req.rid, []).append(rows)
            return end
        parts = [*chunks.pop(req.rid, []), rows]
        if store:
            req.hidden_states.append(KEY_PREFIX + _write(directory, req, parts))
        return end

    _append_prefill_hidden_states._regen_capture = True  # type: ignore[attr-defined]
    cls._append_prefill_hidden_states = _append_prefill_hidden_states


def _write(directory: str, req: Any, parts: list[tuple[Any, Any]]) -> str:
    import torch
    from safetensors.torch import save_file

    tensors = {
        "input_ids": torch.tensor(list(req.origin_input_ids), dtype=torch.int32),
        "aux_hidden_state": torch.cat([aux for aux, _ in parts]).contiguous(),
    }
    if all(last is not None for _, last in parts):
        tensors["hidden_state"] = torch.cat([last for _, last in parts]).contiguous()
    key = uuid.uuid4().hex
    final = os.path.join(directory, f"{key}.safetensors")
    temp = final + ".tmp"
    save_file(tensors, temp, metadata={"rid": str(req.rid)})
    os.replace(temp, final)
    return key
