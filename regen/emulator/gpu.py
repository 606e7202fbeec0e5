"""The emulated GPU: how long a decode step takes for a batch, and how SGLang 0.5.23 sizes a
server from its KV pool. Pure arithmetic; `regen.emulator.batch` runs the clock.

Why a curve: on a GPU a decode step reads every weight once whatever the batch, so while the
batch is small the step time is flat (memory-bound) and throughput grows with every request
added; past a knee the step's arithmetic dominates and the time grows with the batch, so
throughput stops growing. Where the knee is depends on the GPU, the model and speculative
decoding (a verify step works on `draft tokens` per request), which is why the client measures
each server instead of trusting one number.

Defaults, and where they come from:

- `tokens_per_s` 250: a lone request's decode speed of the incident's workload (Qwen3.6-27B with
  MTP on one B200, 234-256 tok/s as benchmarked; SGLANG_API.md, "The target workload").
- `knee` 128 requests: vllm-project/speculators PR #510 swept the in-flight requests of a
  regeneration of a dense 31B model (gemma-4-31B, TP2 x DP4): 3.10, 5.60, 8.75, 11.28, 11.53
  samples/s at 16, 32, 64, 128, 256 per server, then 10.86 at 512 and 8.91 at 2,048 (the KV
  pool full). Near-linear to 64, flat between 128 and 256: the knee of a dense ~30B model.
- `kv_tokens` 400,000: a B200's 183 GB at --mem-fraction-static 0.88 less 54 GB of bf16
  weights, at 256 KiB of KV per token (64 layers x 8 KV heads x 128 x K and V x 2 bytes).
- `prefill_tokens_per_s` 10,000 (args.py) and SGLang's scheduler constants below, read from
  the 0.5.23 wheel (schedule_policy.py, new_token_ratio_tracker.py, environ.py,
  kv_cache_configurator.resolve_max_num_reqs).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOKENS_PER_S = 250.0
DEFAULT_KNEE = 128
DEFAULT_KV_TOKENS = 400_000
DEFAULT_CHUNKED_PREFILL = 8192  # --chunked-prefill-size on an 80 GB-class GPU
# How sharp the knee is: step time (1 + (b/knee)^4)^(1/4), within 1.6 % of flat at half the
# knee and within 1 % of proportional to the batch at twice it.
_SHARPNESS = 4

# SGLang 0.5.23's admission and retraction (environ.py, schedule_policy.py).
CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600  # per decode step
RETRACT_DECODE_STEPS = 20


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """Decode step time by batch size. `knee` None: no knee, every request decodes at
    `tokens_per_s` however many run (the emulator's linear model before the curve)."""

    tokens_per_s: float = DEFAULT_TOKENS_PER_S
    knee: int | None = DEFAULT_KNEE

    def step_s(self, batch: int) -> float:
        """Simulated seconds of one decode step: one token for each of `batch` requests."""
        base = 1.0 / self.tokens_per_s
        if self.knee is None or batch <= 0:
            return base
        return base * (1.0 + (batch / self.knee) ** _SHARPNESS) ** (1.0 / _SHARPNESS)

    def throughput(self, batch: int) -> float:
        """Decoded tokens per simulated second of the whole batch."""
        return batch / self.step_s(batch) if batch > 0 else 0.0


def sglang_max_running(kv_tokens: int, context_length: int) -> int:
    """SGLang's own max_running_requests when none is given (resolve_max_num_reqs): 512 per
    context's worth of KV, clamped to [2048, 4096], and never over half the pool."""
    estimated = max(min(int(kv_tokens / context_length * 512), 4096), 2048)
    return max(1, min(estimated, kv_tokens // 2))


def capped_max_running(requested: int, kv_tokens: int) -> int:
    """An explicit --max-running-requests, which SGLang still caps at half the pool."""
    return max(1, min(requested, kv_tokens // 2))
