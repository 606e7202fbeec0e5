"""`/metrics` in Prometheus text: the `sglang:` series a benchmark or the fleet reads.

Counters are real counts of what was served, so delivered tokens over a window can be
computed from two scrapes, as on a real server.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from regen.emulator.batch import Batch

# SGLang's default buckets for sglang:e2e_request_latency_seconds.
LATENCY_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0,
    100.0, 200.0, 400.0, 800.0,
)  # fmt: skip


@dataclass
class Counters:
    """What was served since start; gauges are passed in when rendering."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, found in the prefix cache
    generation_tokens: int = 0
    requests: int = 0
    latency_sum: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))

    def record(
        self, prompt_tokens: int, completion_tokens: int, latency_s: float, cached_tokens: int = 0
    ) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.generation_tokens += completion_tokens
        self.requests += 1
        self.latency_sum += latency_s
        at = bisect.bisect_left(LATENCY_BUCKETS, latency_s)
        if at < len(LATENCY_BUCKETS):
            self.latency_buckets[at] += 1


def _labels(model: str, **extra: str) -> str:
    pairs = {"model_name": model, "engine_type": "unified", **extra}
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"') for v in pairs.values())
    return "{" + ",".join(f'{k}="{v}"' for k, v in zip(pairs, escaped, strict=True)) + "}"


def render(counters: Counters, batch: Batch, *, model: str, accept_length: float) -> str:
    """The exposition text, one sample per series, each labelled with model_name; the gauges
    and the scheduler's counters are the batch's (regen.emulator.batch)."""
    base = _labels(model)
    running, queued = batch.running, batch.queued
    req = _labels(model, is_streaming="false")
    lines: list[str] = []

    def series(name: str, kind: str, doc: str, samples: list[tuple[str, str, float]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(
            f"{name}{suffix}{labels} {float(value)!r}" for suffix, labels, value in samples
        )

    series(
        "sglang:num_running_reqs", "gauge", "The number of running requests.", [("", base, running)]
    )
    series(
        "sglang:num_queue_reqs",
        "gauge",
        "The number of requests in the waiting queue.",
        [("", base, queued)],
    )
    series(
        "sglang:gen_throughput",
        "gauge",
        "The generation throughput (token/s).",
        [("", base, batch.gen_throughput)],
    )
    series("sglang:token_usage", "gauge", "The token usage.", [("", base, batch.token_usage)])
    series(
        "sglang:num_used_tokens",
        "gauge",
        "The number of used tokens.",
        [("", base, float(round(batch.kv_used)))],
    )
    series(
        "sglang:cache_hit_rate",
        "gauge",
        "The prefix cache hit rate.",
        [("", base, batch.cache_hit_rate)],
    )
    series(
        "sglang:spec_accept_length",
        "gauge",
        "The average acceptance length of speculative decoding.",
        [("", base, accept_length)],
    )
    series(
        "sglang:num_retracted_reqs",
        "gauge",
        "The number of retracted requests.",
        [("", base, batch.retracted_last)],
    )
    series(
        "sglang:num_retracted_requests_total",
        "counter",
        "Total number of retracted requests.",
        [("", base, batch.retracted_total)],
    )
    # Counted at every decode step (prefill batch), where generation_tokens_total counts a
    # request's tokens only when it ends: the rate of the batch as it runs.
    realtime: list[tuple[str, str, float]] = [
        ("", _labels(model, mode=mode), float(value))
        for mode, value in (
            ("prefill_compute", batch.prefill_tokens),
            ("prefill_cache", batch.prefill_cache_tokens),
            ("decode", float(int(batch.decoded_now))),
        )
        if value  # a labelled counter has no sample until its first increment
    ]
    series(
        "sglang:realtime_tokens_total",
        "counter",
        "Total number of tokens processed (updated on each log interval). "
        "mode: prefill_compute, prefill_cache, decode.",
        realtime,
    )
    series(
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        [("", req, counters.prompt_tokens)],
    )
    series(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        [("", req, counters.generation_tokens)],
    )
    # A labelled counter has no sample until its first increment (prometheus_client); every
    # hit here is the GPU's own cache, so cache_source="device" (output_streamer.py).
    hits = [("", _labels(model, cache_source="device"), float(counters.cached_tokens))]
    series(
        "sglang:cached_tokens_total",
        "counter",
        "Number of cached prompt tokens by source (device/host/storage).",
        hits if counters.cached_tokens else [],
    )
    cumulative = 0
    buckets: list[tuple[str, str, float]] = []
    for bound, count in zip(LATENCY_BUCKETS, counters.latency_buckets, strict=True):
        cumulative += count
        buckets.append(("_bucket", _labels(model, is_streaming="false", le=str(bound)), cumulative))
    buckets.append(("_bucket", _labels(model, is_streaming="false", le="+Inf"), counters.requests))
    buckets += [("_count", req, counters.requests), ("_sum", req, counters.latency_sum)]
    series(
        "sglang:e2e_request_latency_seconds",
        "histogram",
        "Histogram of End-to-end request latency in seconds",
        buckets,
    )
    return "\n".join(lines) + "\n"
