"""Dispatcher bench: does the client keep every emulated GPU slot busy, cheaply?

Runs, all against real emulator processes with long-tailed (log-uniform) output lengths:
- shared: every shard submitted at once through one Dispatcher (what the flow does);
- baseline: the same Dispatcher fed one shard of 500 at a time, waiting for each (the
  incident's client, whose slots drained at every batch end);
- slow: the shared run with one server at `slow=0.5`;
- rss: a fresh process doing what the flow's generation does for 1M prompts: the plan
  (id, shard) in memory, each shard read from the prompt cache when submitted, 32 shards
  in flight, 64 shards streamed through fast emulators (1-token answers); peak RSS.
  (`--rss-only` reruns just this one and updates the results file.)
- multiturn: conversations of 1..5 user turns (mean 3, uniform) under
  `regeneration.turns: all`, all shards at once, as shared: a conversation's next turn is
  sent when its previous answer returns, so the slots must stay full while rows are
  mid-conversation, not only while fresh rows remain (`--multiturn-only` reruns just it).

Throughput and utilisation come from the emulators' own /metrics, scraped every 0.2 s,
over the steady window: from one longest-request time after the start (counters count a
request when it ends) until the queue runs dry (the one final drain of a run is a
fixed cost, ~one request length out of a 1M-prompt run; the `*_full_run` figures include
it). CPU is the bench process's CPU minus the scraper thread's own.

    .venv/bin/python benches/dispatch.py [--quick | --smoke] [--multiturn-only]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.client import Dispatcher
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from support.emulator import emulators

ROOT = Path(__file__).resolve().parents[1]
MODEL = "emu-model"
KEY = "bench-key"
SHARD = 500


@dataclass(frozen=True)
class Setup:
    servers: int
    slots: int
    requests: int
    baseline_requests: int
    slow_requests: int
    multiturn_conversations: int
    rss_prompts: int
    rss_stream_shards: int
    time_scale: float
    tokens_per_s: float
    max_tokens: int
    reasoning: str
    answer: str
    rss_in_flight: int = 32  # the flow's thread pool

    def capacity(self, slow: float = 1.0) -> float:
        """Tokens/s the fleet can deliver: every slot decoding at its server's speed."""
        speeds = [slow] + [1.0] * (self.servers - 1)
        return sum(self.slots * s * self.tokens_per_s / self.time_scale for s in speeds)

    def longest_s(self) -> float:
        return self.max_tokens / self.tokens_per_s * self.time_scale * 2


@contextmanager
def fleet(
    setup: Setup, logs: Path, slow: float | None = None, *, same_draws: bool = False
) -> Iterator[list[Endpoint]]:
    """`same_draws`: servers of one model that sample by a request's seed (SGLang's
    --enable-deterministic-inference), so a row's seed gives it the same answer on any of them;
    else each server answers from a seed of its own."""
    flags = [
        [
            "--max-running-requests", str(setup.slots), "--enable-metrics",
            "--reasoning-parser", "qwen3",
            *(["--enable-deterministic-inference"] if same_draws else []),
            "--emu-load-s", "0", "--emu-seed", str(0 if same_draws else i),
            "--emu-tokens-per-s", str(setup.tokens_per_s),
            # The linear model: its ideal is every slot at tokens_per_s (Setup.capacity).
            "--emu-batch-knee", "0",
            "--emu-time-scale", str(setup.time_scale),
            "--emu-reasoning-tokens", setup.reasoning, "--emu-answer-tokens", setup.answer,
            *(["--emu-fault", f"slow={slow}"] if slow is not None and i == 0 else []),
        ]
        for i in range(setup.servers)
    ]  # fmt: skip
    with emulators(logs, flags, timeout=120, served_name=MODEL, api_key=KEY) as started:
        yield [Endpoint(i, emu.url) for i, emu in enumerate(started)]


_SERIES = re.compile(r"^(sglang:\w+)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.M)


def scrape(endpoint: Endpoint) -> dict[str, float]:
    with urllib.request.urlopen(f"{endpoint.url}/metrics", timeout=10) as resp:
        return {m[1]: float(m[2]) for m in _SERIES.finditer(resp.read().decode())}


class Scraper:
    """Samples (time, Σ running, Σ generation tokens, queued) from every server."""

    def __init__(self, endpoints: list[Endpoint], dispatcher: Dispatcher) -> None:
        self._endpoints = endpoints
        self._dispatcher = dispatcher
        self._stop = threading.Event()
        self.samples: list[tuple[float, float, float, int]] = []
        self.cpu_s = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            metrics = [scrape(e) for e in self._endpoints]
            queued = self._dispatcher.stats().queued
            running = sum(m["sglang:num_running_reqs"] for m in metrics)
            tokens = sum(m["sglang:generation_tokens_total"] for m in metrics)
            self.samples.append((now, running, tokens, queued))
            self.cpu_s = time.thread_time()
            if self._stop.wait(0.2):
                return


def prompt_frame(n: int, prefix: str = "q") -> pl.DataFrame:
    """n distinct short prompts built with expressions (no Python loop over rows)."""
    text = "Explain step by step how to solve the following problem and give the answer " * 4
    i = pl.int_range(n, dtype=pl.Int64)
    content = pl.format("{} #{}", pl.lit(text).str.slice(0, 40 + (i * 7919) % 160), i)
    return pl.select(
        id=pl.format(f"{prefix}-{{}}", i.cast(pl.String).str.zfill(7)),
        messages=pl.concat_list(pl.struct(role=pl.lit("user"), content=content)),
    ).cast({"messages": row_schema()["messages"]})


def conversation_frame(n: int, prefix: str = "c") -> pl.DataFrame:
    """n conversations of a system message and 1..5 user messages (mean 3 when 5 divides n,
    spread over every shard), the input `turns: all` takes: no assistant messages."""
    i = pl.int_range(n, dtype=pl.Int64)
    turns = 1 + (i * 2) % 5  # 1, 3, 5, 2, 4, ...: each shard of 500 holds every length
    user = pl.int_ranges(0, turns).list.eval(
        pl.struct(
            role=pl.lit("user"),
            content=pl.format(
                "Follow-up {}: explain step by step and give the answer", pl.element()
            ),
        )
    )
    system = pl.struct(role=pl.lit("system"), content=pl.format("You are assistant #{}.", i))
    return pl.select(
        id=pl.format(f"{prefix}-{{}}", i.cast(pl.String).str.zfill(7)),
        messages=pl.concat_list(system, user),
    ).cast({"messages": row_schema()["messages"]})


def make_dispatcher(
    setup: Setup,
    endpoints: list[Endpoint],
    max_tokens: int,
    regeneration: RegenerationConfig | None = None,
) -> Dispatcher:
    return Dispatcher(
        endpoints,
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=max_tokens),
        generation=GenerationConfig(),
        concurrency_per_server=setup.slots,
        regeneration=regeneration,
    )


def run_load(
    setup: Setup,
    endpoints: list[Endpoint],
    frame: pl.DataFrame,
    *,
    batched: bool,
    slow: float = 1.0,
    regeneration: RegenerationConfig | None = None,
) -> dict[str, float]:
    """`requests` counts rows (conversations); `turns` the chat requests they took, which
    CPU and tokens are divided by."""
    requests = frame.height
    shards = [frame.slice(at, SHARD) for at in range(0, requests, SHARD)]
    with (
        make_dispatcher(setup, endpoints, setup.max_tokens, regeneration) as d,
        Scraper(endpoints, d) as sc,
    ):
        cpu0, start = time.process_time(), time.monotonic()
        if batched:
            outs = []
            for k, rows in enumerate(shards):
                last_submit = time.monotonic()
                outs.append(d.submit_shard(k, rows).result())
        else:
            futures = [d.submit_shard(k, rows) for k, rows in enumerate(shards)]
            last_submit = time.monotonic()
            outs = [f.result() for f in futures]
        end = time.monotonic()
        cpu = time.process_time() - cpu0
    cpu -= sc.cpu_s
    out = pl.concat(outs)
    assert out.height == requests and out["id"].n_unique() == requests
    samples = sc.samples
    # The queue runs dry when the last rows are handed out; batched, that is the last batch.
    dry = next((t for t, _, _, q in samples if t >= last_submit and q == 0), samples[-1][0])
    steady = [s for s in samples if start + setup.longest_s() <= s[0] <= dry]
    if len(steady) < 3:  # a short (quick) run: use everything up to the dry point
        steady = [s for s in samples if s[0] <= dry]
    (t0, _, k0, _), (t1, _, k1, _) = steady[0], steady[-1]
    capacity = setup.capacity(slow)
    slots = setup.servers * setup.slots
    tokens = int(out["completion_tokens"].sum())  # a conversation's sum over its turns
    turns = int(out["turns"].list.len().sum())
    busy = [s for s in samples if start <= s[0] <= dry]
    return {
        "requests": requests,
        "wall_s": end - start,
        "errors": int(out["error"].is_not_null().sum()),
        "capacity_ratio": (k1 - k0) / (t1 - t0) / capacity if t1 > t0 else float("nan"),
        "slot_utilisation": sum(r for _, r, _, _ in busy) / len(busy) / slots,
        "capacity_ratio_full_run": tokens / (end - start) / capacity,
        "slot_utilisation_full_run": sum(r for _, r, _, _ in samples) / len(samples) / slots,
        "client_cpu_ms_per_request": 1000 * cpu / turns,
        "mean_tokens": tokens / turns,
        "turns": turns,
    }


def peak_rss_mb() -> float:
    """VmHWM, this process's own peak; ru_maxrss would include the parent's from before exec."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)[1]) / 1024  # type: ignore[index]


def rss_child(urls: list[str], path: str, stream_shards: int, in_flight: int) -> None:
    """Runs in a fresh process, as the flow's generation does (tasks/generate.py): holds the
    1M-row plan (id, shard), reads each shard's prompts from the row-group-per-shard prompt
    cache, keeps `in_flight` shards submitted (the flow's thread pool) and streams
    `stream_shards` of them through; prints peak RSS in MB."""
    plan = pl.read_parquet(path, columns=["id", "shard"])
    plan_rss = peak_rss_mb()
    endpoints = [Endpoint(i, url) for i, url in enumerate(urls)]
    shards = plan["shard"].max() + 1  # type: ignore[operator]

    def read(shard: int) -> pl.DataFrame:
        return pl.scan_parquet(path).filter(pl.col("shard") == shard).collect()

    with Dispatcher(
        endpoints,
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=1),
        generation=GenerationConfig(),
        concurrency_per_server=64,
    ) as d:
        window = deque(d.submit_shard(k, read(k)) for k in range(in_flight))
        for k in range(in_flight, stream_shards):
            window.popleft().result()  # committed by the shard task and dropped
            window.append(d.submit_shard(k, read(k)))
        for future in window:
            future.result()
    peak = peak_rss_mb()
    print(json.dumps({
        "plan_rows": plan.height, "plan_mb": plan.estimated_size("mb"), "shards": shards,
        "rss_after_plan_mb": plan_rss, "rss_peak_mb": peak,
        "streamed_rows": stream_shards * SHARD, "shards_in_flight": in_flight,
    }))  # fmt: skip


def measure_rss(setup: Setup, endpoints: list[Endpoint], tmp: Path) -> dict[str, float]:
    """The prompt cache is written here, in the bench process, as plan-shards does."""
    path = tmp / "prompts.parquet"
    frame = prompt_frame(setup.rss_prompts)
    frame.with_columns(shard=pl.int_range(frame.height) // SHARD).select(
        "id", "shard", "messages"
    ).write_parquet(path, compression="zstd", row_group_size=SHARD, statistics=True)
    del frame
    cmd = [sys.executable, __file__, "--rss-child", str(path), str(setup.rss_stream_shards),
           str(setup.rss_in_flight), *(e.url for e in endpoints)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_multiturn(setup: Setup, endpoints: list[Endpoint]) -> dict[str, float]:
    """The steady window ends as for shared: `stats().queued` counts a row waiting for its
    next turn too, so the queue is dry only when no conversation has a turn waiting."""
    frame = conversation_frame(setup.multiturn_conversations)
    return run_load(
        setup, endpoints, frame, batched=False, regeneration=RegenerationConfig(turns="all")
    )


def print_runs(runs: dict[str, dict[str, float]]) -> None:
    print(f"{'run':10} {'requests':>9} {'turns':>7} {'wall_s':>8} {'cap':>6} {'util':>6} "
          f"{'cap_full':>9} {'util_full':>9} {'cpu_ms':>7} {'errors':>6}")  # fmt: skip
    for name, r in runs.items():
        print(f"{name:10} {r['requests']:>9} {r['turns']:>7} {r['wall_s']:>8.1f} "
              f"{r['capacity_ratio']:>6.3f} {r['slot_utilisation']:>6.3f} "
              f"{r['capacity_ratio_full_run']:>9.3f} {r['slot_utilisation_full_run']:>9.3f} "
              f"{r['client_cpu_ms_per_request']:>7.3f} {r['errors']:>6}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a small run (~1 min)")
    p.add_argument("--smoke", action="store_true", help="seconds: checks that it runs")
    p.add_argument("--time-scale", type=float, default=0.8, help="wall s per simulated s")
    p.add_argument("--rss-only", action="store_true", help="rerun only the RSS figure")
    p.add_argument("--multiturn-only", action="store_true", help="rerun only the multi-turn figure")
    p.add_argument("--rss-child", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rss_child:
        path, stream, in_flight, *urls = a.rss_child
        rss_child(urls, path, int(stream), int(in_flight))
        return
    common: dict[str, Any] = dict(
        tokens_per_s=250.0, max_tokens=4096, reasoning="200:4000", answer="20:800"
    )
    smoke: dict[str, Any] = dict(reasoning="20:200", answer="10:50")
    setup = (
        Setup(servers=2, slots=8, requests=200, baseline_requests=100, slow_requests=100,
              multiturn_conversations=40, rss_prompts=2 * SHARD, rss_stream_shards=2,
              rss_in_flight=2, time_scale=0.3, **{**common, **smoke})
        if a.smoke
        else Setup(servers=2, slots=16, requests=1000, baseline_requests=1000, slow_requests=1000,
              multiturn_conversations=500, rss_prompts=100_000, rss_stream_shards=4,
              time_scale=0.2, **common)
        if a.quick
        else Setup(servers=8, slots=64, requests=20_000, baseline_requests=2_500,
                   slow_requests=5_000, multiturn_conversations=4_000, rss_prompts=1_000_000,
                   rss_stream_shards=64, time_scale=a.time_scale, **common)
    )  # fmt: skip
    if a.smoke:
        result_path = results_path("dispatch", smoke=True)
    else:
        name = "dispatch-quick.json" if a.quick else "dispatch.json"
        result_path = ROOT / "benches" / "results" / name
    if a.rss_only or a.multiturn_only:
        empty: dict[str, Any] = {"setup": {}, "runs": {}}
        saved: dict[str, Any] = (
            json.loads(result_path.read_text()) if result_path.exists() else empty
        )
        with (
            tempfile.TemporaryDirectory(prefix="regen-dispatch-bench-") as tmp,
            fleet(setup, Path(tmp)) as endpoints,
        ):
            if a.rss_only:
                rss = measure_rss(setup, endpoints, Path(tmp))
                saved["rss_mb_1m_prompts"] = rss["rss_peak_mb"]
                saved["runs"]["rss"] = rss
                print(f"rss: {rss}")
            if a.multiturn_only:
                multi = run_multiturn(setup, endpoints)
                saved["multiturn_slot_utilisation"] = multi["slot_utilisation"]
                saved["setup"]["multiturn_conversations"] = setup.multiturn_conversations
                saved["runs"]["multiturn"] = multi
                print_runs({"multiturn": multi})
        result_path.write_text(json.dumps(saved, indent=2) + "\n")
        return
    with tempfile.TemporaryDirectory(prefix="regen-dispatch-bench-") as tmp:
        with fleet(setup, Path(tmp)) as endpoints:
            shared = run_load(setup, endpoints, prompt_frame(setup.requests), batched=False)
            baseline = run_load(
                setup, endpoints, prompt_frame(setup.baseline_requests), batched=True
            )
            multi = run_multiturn(setup, endpoints)
            rss = measure_rss(setup, endpoints, Path(tmp))
        with fleet(setup, Path(tmp), slow=0.5) as endpoints:
            slowed = run_load(
                setup, endpoints, prompt_frame(setup.slow_requests), batched=False, slow=0.5
            )
    results = {
        "capacity_ratio": shared["capacity_ratio"],
        "slot_utilisation": shared["slot_utilisation"],
        "baseline_slot_utilisation": baseline["slot_utilisation"],
        "slow_server_capacity_ratio": slowed["capacity_ratio"],
        "multiturn_slot_utilisation": multi["slot_utilisation"],
        "client_cpu_ms_per_request": shared["client_cpu_ms_per_request"],
        "rss_mb_1m_prompts": rss["rss_peak_mb"],
        "setup": {**setup.__dict__, "quick": a.quick, "smoke": a.smoke, "shard_size": SHARD},
        "runs": {
            "shared": shared, "baseline": baseline, "slow": slowed, "multiturn": multi, "rss": rss
        },
    }  # fmt: skip
    targets = {
        "capacity_ratio": ">= 0.97", "slot_utilisation": ">= 0.95",
        "baseline_slot_utilisation": "(reference)", "slow_server_capacity_ratio": ">= 0.95",
        "multiturn_slot_utilisation": ">= 0.95",
        "client_cpu_ms_per_request": "<= 1", "rss_mb_1m_prompts": "<= 400",
    }  # fmt: skip
    print(f"{'figure':32} {'value':>10}  target")
    for key, target in targets.items():
        print(f"{key:32} {results[key]:>10.3f}  {target}")
    print()
    print_runs({"shared": shared, "baseline": baseline, "slow": slowed, "multiturn": multi})
    print(f"rss: {rss}")
    result_path.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
