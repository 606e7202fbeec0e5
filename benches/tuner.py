"""Concurrency bench: does the tuner find each server's best concurrency?

On emulated GPUs with a batch curve (regen.emulator.gpu: a decode step flat until a knee, a KV
pool that queues and retracts), three fleets of two servers each: a small model on H100s, a
big one on H100s (KV-bound), and the big one on a mixed fleet (an H100 and a B200, where no
single number suits both). For each: an exhaustive sweep of fixed concurrencies (the same for
every server, as `concurrency_per_server` sets it; 64 is regen's default before the tuner),
and the tuner, which starts at 64 and measures each server. Throughput is the servers' own
decode counters (`sglang:realtime_tokens_total`) over the same measuring window, in simulated
tokens/s; the tuner's window starts once it settled, and its climb is reported beside.

The emulated curves (simulated units; orders of magnitude from each GPU's bandwidth and FLOPs,
the knee from the speculators PR #510 sweep, see regen/emulator/gpu.py):

    8b-h100   8B bf16 on one H100:   150 tok/s alone, knee 128, KV 400k tokens, prefill 40k/s
    32b-h100  32B fp8 on one H100:    80 tok/s alone, knee 128, KV 130k tokens, prefill 12k/s
    32b-b200  32B fp8 on one B200:   160 tok/s alone, knee 128, KV 600k tokens, prefill 30k/s

Answers are the emulator's long-tailed lengths (reasoning 200:3000, answer 20:600 tokens);
each run is a fresh dispatcher on the case's emulators, thousands of rows queued.

    .venv/bin/python benches/tuner.py [--smoke] [--cases NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from benches.dispatch import prompt_frame
from regen.client import Dispatcher
from regen.concurrency import Phase, TunerSettings
from regen.concurrency.tuner import ConcurrencyTuner
from regen.config import GenerationConfig, SamplingConfig
from regen.fleet.metrics import scrape
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import auth_headers
from regen.sglang_api.server_info import server_limits
from support.emulator import Emulator, emulators

MODEL = "emu-model"
KEY = "bench-key"
SHARD = 500
DEFAULT = 64  # regen's fixed concurrency before the tuner (engine.max_running_requests)


@dataclass(frozen=True)
class Curve:
    tokens_per_s: float
    knee: int
    kv_tokens: int
    prefill_tokens_per_s: float

    def flags(self) -> list[str]:
        return [
            "--emu-tokens-per-s", str(self.tokens_per_s), "--emu-batch-knee", str(self.knee),
            "--emu-kv-tokens", str(self.kv_tokens),
            "--emu-prefill-tokens-per-s", str(self.prefill_tokens_per_s),
        ]  # fmt: skip


CURVES = {
    "8b-h100": Curve(150.0, 128, 400_000, 40_000.0),
    "32b-h100": Curve(80.0, 128, 130_000, 12_000.0),
    "32b-b200": Curve(160.0, 128, 600_000, 30_000.0),
}
CASES = {
    "8B on 2 x H100": ["8b-h100", "8b-h100"],
    "32B on 2 x H100": ["32b-h100", "32b-h100"],
    "32B on H100 + B200": ["32b-h100", "32b-b200"],
}


@dataclass(frozen=True)
class Setup:
    levels: tuple[int, ...]
    time_scale: float
    warm_s: float  # wall seconds before a fixed run's window (the batch fills, settles)
    measure_s: float  # the window
    climb_s: float  # the most the tuner is given to settle
    interval_s: float  # the tuner's
    reasoning: str
    answer: str
    max_tokens: int
    smoke: bool = False


FULL = Setup(
    levels=(16, 32, 64, 128, 256, 512), time_scale=0.5, warm_s=12.0, measure_s=24.0,
    climb_s=90.0, interval_s=2.0, reasoning="200:3000", answer="20:600", max_tokens=4096,
)  # fmt: skip
SMOKE = Setup(
    levels=(16, 64), time_scale=0.5, warm_s=1.0, measure_s=2.0, climb_s=6.0, interval_s=0.5,
    reasoning="20:200", answer="10:50", max_tokens=512, smoke=True,
)  # fmt: skip


def decoded(endpoints: list[Endpoint]) -> float:
    """Tokens every server has decoded so far (its realtime counter)."""
    total = 0.0
    for endpoint in endpoints:
        metrics = scrape(endpoint.url)
        if metrics is None or metrics.decode_tokens is None:
            raise RuntimeError(f"{endpoint.url}/metrics has no decode counter")
        total += metrics.decode_tokens
    return total


def window(endpoints: list[Endpoint], seconds: float, time_scale: float) -> float:
    """Simulated tokens/s the fleet decodes over the next `seconds` of wall time."""
    t0, d0 = time.monotonic(), decoded(endpoints)
    time.sleep(seconds)
    t1, d1 = time.monotonic(), decoded(endpoints)
    return (d1 - d0) / (t1 - t0) * time_scale


class Load:
    """A dispatcher over the case's servers with more rows queued than a run can finish."""

    def __init__(self, setup: Setup, endpoints: list[Endpoint], start: int, cap: int) -> None:
        self.dispatcher = Dispatcher(
            endpoints,
            api_key=SecretStr(KEY),
            model=MODEL,
            sampling=SamplingConfig(max_tokens=setup.max_tokens),
            generation=GenerationConfig(),
            concurrency_per_server=start,
            slot_cap=max(start, cap),
        )
        self.endpoints = endpoints
        self._rows = 0
        self._futures: list[Future[pl.DataFrame]] = []

    def __enter__(self) -> Load:
        self.dispatcher.start()
        self.top_up()
        return self

    def top_up(self) -> None:
        """Keep four waves of every slot queued (the tuner must never run dry)."""
        stats = self.dispatcher.stats()
        want = 4 * sum(s.slots for s in stats.servers) + SHARD
        # Rows this side has submitted: the dispatcher counts a shard once its loop takes it.
        while self._rows - stats.done - stats.in_flight < want:
            frame = prompt_frame(SHARD, prefix=f"r{len(self._futures)}")
            self._futures.append(self.dispatcher.submit_shard(len(self._futures), frame))
            self._rows += SHARD

    def __exit__(self, *exc: object) -> None:
        self.dispatcher.abort(RuntimeError("bench run over"))
        for future in self._futures:
            future.exception()
        self.dispatcher.close()
        idle(self.endpoints)


def idle(endpoints: list[Endpoint]) -> None:
    """Every server empty before the next run: what the last one left running is cut (a
    closed connection does not stop an emulator's request, as it does SGLang's)."""
    for endpoint in endpoints:
        request = urllib.request.Request(
            endpoint.abort_url,
            data=json.dumps({"abort_all": True}).encode(),
            headers={**auth_headers(SecretStr(KEY)), "Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=30).read()
    deadline = time.monotonic() + 60
    while any((m := scrape(e.url)) is None or m.running or m.queued for e in endpoints):
        if time.monotonic() > deadline:
            raise RuntimeError("the servers did not drain within 60 s")
        time.sleep(0.1)


def run_fixed(setup: Setup, endpoints: list[Endpoint], level: int) -> float:
    with Load(setup, endpoints, level, level) as load:
        deadline = time.monotonic() + setup.warm_s
        while time.monotonic() < deadline:
            load.top_up()
            time.sleep(0.2)
        return window(endpoints, setup.measure_s, setup.time_scale)


def run_tuned(setup: Setup, endpoints: list[Endpoint], caps: dict[str, int]) -> dict[str, Any]:
    settings = TunerSettings(interval_s=setup.interval_s, reprobe_every=10_000)
    with Load(setup, endpoints, DEFAULT, max(caps.values())) as load:
        tuner = ConcurrencyTuner(load.dispatcher, endpoints, caps, start=DEFAULT, settings=settings)
        with tuner:
            began = time.monotonic()
            while time.monotonic() - began < setup.climb_s and any(
                c.phase is not Phase.SETTLED for c in tuner.controllers.values()
            ):
                load.top_up()
                time.sleep(0.2)
            settled_s = time.monotonic() - began
            # The first window from the start, like a fixed run's, then the settled one.
            rate = window(endpoints, setup.measure_s, setup.time_scale)
            load.top_up()
            return {
                "tok_s": rate,
                "levels": tuner.levels(),
                "settle_s": round(settled_s, 1),
                "settled": all(c.phase is Phase.SETTLED for c in tuner.controllers.values()),
                "changes": [
                    f"{name}: {d.previous} -> {d.limit} ({d.reason})" for name, d in tuner.changes
                ],
            }


def run_case(setup: Setup, name: str, logs: Path) -> dict[str, Any]:
    curves = CASES[name]
    common = [
        "--enable-metrics", "--emu-load-s", "0", "--emu-time-scale", str(setup.time_scale),
        "--emu-reasoning-tokens", setup.reasoning, "--emu-answer-tokens", setup.answer,
        "--reasoning-parser", "qwen3",
    ]  # fmt: skip
    flags = [[*common, "--emu-seed", str(i), *CURVES[c].flags()] for i, c in enumerate(curves)]
    with emulators(logs, flags, timeout=120, served_name=MODEL, api_key=KEY) as started:
        endpoints = [Endpoint(i, emu.url) for i, emu in enumerate(started)]
        caps = {e.name: own_cap(emu) for e, emu in zip(endpoints, started, strict=True)}
        sweep: dict[int, float] = {}
        for level in setup.levels:
            sweep[level] = run_fixed(setup, endpoints, level)
            print(f"  {name}: fixed {level:4d}  {sweep[level]:9,.0f} tok/s", flush=True)
        tuned = run_tuned(setup, endpoints, caps)
        print(f"  {name}: tuned {tuned['levels']}  {tuned['tok_s']:9,.0f} tok/s "
              f"(settled in {tuned['settle_s']} s)", flush=True)  # fmt: skip
    best = max(sweep, key=lambda k: sweep[k])
    default = sweep.get(DEFAULT)
    return {
        "case": name,
        "curves": {f"server-{i}": {"name": c, **asdict(CURVES[c])} for i, c in enumerate(curves)},
        "server_caps": caps,
        "sweep": {str(k): round(v, 1) for k, v in sweep.items()},
        "best_fixed": best,
        "best_fixed_tok_s": round(sweep[best], 1),
        "default_tok_s": None if default is None else round(default, 1),
        "tuned": {**tuned, "tok_s": round(tuned["tok_s"], 1)},
        "tuned_to_best": round(tuned["tok_s"] / sweep[best], 3),
        "tuned_to_default": None if not default else round(tuned["tok_s"] / default, 3),
    }


def own_cap(emu: Emulator) -> int:
    """The server's max_running_requests from its /server_info, under the tuner's ceiling."""
    request = urllib.request.Request(f"{emu.url}/server_info", headers=auth_headers(SecretStr(KEY)))
    with urllib.request.urlopen(request, timeout=30) as resp:
        own = server_limits(json.loads(resp.read())).max_running_requests
    return min(own or TunerSettings().max_concurrency, TunerSettings().max_concurrency)


def print_table(results: list[dict[str, Any]]) -> None:
    print()
    print(f"{'case':22} {'sweep best':>17} {'tuned':>22} {'default 64':>11} "
          f"{'tuned/best':>10} {'tuned/default':>13} {'settle s':>8}")  # fmt: skip
    for r in results:
        levels = "/".join(str(v) for v in r["tuned"]["levels"].values())
        best = f"{r['best_fixed']}: {r['best_fixed_tok_s']:,.0f}"
        tuned = f"{levels}: {r['tuned']['tok_s']:,.0f}"
        default = f"{r['default_tok_s']:,.0f}" if r["default_tok_s"] else "-"
        print(f"{r['case']:22} {best:>17} {tuned:>22} {default:>11} "
              f"{r['tuned_to_best']:>10.3f} {r['tuned_to_default'] or 0:>13.3f} "
              f"{r['tuned']['settle_s']:>8}")  # fmt: skip
    print("(simulated decode tokens/s of the fleet over the same window; tuned levels per server)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="seconds: checks that it runs")
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=None)
    a = p.parse_args()
    setup = SMOKE if a.smoke else FULL
    names = a.cases or (["32B on H100 + B200"] if a.smoke else list(CASES))
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="regen-tuner-bench-") as tmp:
        results = [run_case(setup, name, Path(tmp)) for name in names]
    print_table(results)
    out = results_path("tuner", smoke=setup.smoke)
    payload = {
        "setup": {**asdict(setup), "cases": names},
        "load_average": {"start": load, "end": os.getloadavg()},
        "results": results,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
