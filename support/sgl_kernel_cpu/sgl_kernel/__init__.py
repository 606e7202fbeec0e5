"""A stand-in for the compiled `sgl_kernel` (wheel `sglang-kernel`), for tests/engine/ only.

PyPI ships `sglang-kernel` for CUDA alone; its CPU build (Intel AMX kernels) is not published
there. tests/engine/build_env.sh copies this package into the engine venv's site-packages as
`sgl_kernel`, so the real sglang 0.5.23 server runs on a CPU (`SGLANG_USE_CPU_ENGINE=1
--device cpu`) with torch's own ops.

It holds no kernels, on purpose. sglang turns its CPU kernels on only when
`torch.ops.sgl_kernel.convert_weight_packed` exists (sglang.srt.utils.common
.cpu_has_amx_support); this package registers no torch ops, so every layer takes its plain
torch path (`forward_native`: RMSNorm, SiLU-and-mul, rotary embedding, torch_native attention,
the pytorch sampler), on any x86 or arm64 CPU, AMX or not.

What remains are the names sglang imports from `sgl_kernel` at module level when
SGLANG_USE_CPU_ENGINE=1 (sglang/kernels/ops/kvcache/cache_move.py, srt/mem_cache/allocation.py,
kernels/ops/speculative/{eagle,cache_locs}.py and spec-decoding helpers). Plain decoding never
calls them; they serve KV-cache moves and speculative decoding, which tests/engine does not use.
Each raises NotImplementedError, so a path that does reach one fails loudly, not wrongly.
"""

from collections.abc import Callable
from typing import NoReturn

__version__ = "0.0.0+regen.cpu.standin"

_IMPORTED_BY_SGLANG = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
)


def _missing(name: str) -> Callable[..., NoReturn]:
    def op(*args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel.{name}: not in regen's CPU stand-in (support/)")

    op.__name__ = name
    return op


globals().update({name: _missing(name) for name in _IMPORTED_BY_SGLANG})
