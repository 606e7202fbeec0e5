"""Lets the CUDA torchvision wheel import beside torch's CPU build (tests/engine/ only).

sglang 0.5.23 imports torchvision at startup (sglang/srt/configs -> multimodal/internvl_utils).
PyPI's torchvision 0.28.0 (the release for torch 2.13) is built for CUDA: its `_C.so` needs
libtorch_cuda.so, so with torch 2.13.0+cpu it does not load, which torchvision tolerates, except
that `torchvision/_meta_registrations.py` then calls `torch.library.register_fake` on
`torchvision::nms` and `torchvision::qnms`, ops that only `_C.so` defines, and the import fails.

The engine venv's `torchvision_cpu_ops.pth` imports this module at interpreter start; it only
puts a finder on sys.meta_path (torch is not imported then). The first `import torchvision`
makes the finder define those two op schemas (no kernels: torchvision.ops.nms still raises its
own "not compiled" error), remove itself, and let the normal import proceed. Image transforms,
all that sglang and transformers use, are plain torch and PIL.
"""

import contextlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libs: list[Any] = []  # a torch.library.Library drops its definitions when collected


class _DefineTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            import torch

            lib = torch.library.Library("torchvision", "FRAGMENT")
            for schema in _SCHEMAS:
                # RuntimeError: already defined, torchvision's _C did load after all
                with contextlib.suppress(RuntimeError):
                    lib.define(schema)
            _libs.append(lib)
        return None  # the regular finders import torchvision itself


if not any(isinstance(f, _DefineTorchvisionOps) for f in sys.meta_path):
    sys.meta_path.insert(0, _DefineTorchvisionOps())
