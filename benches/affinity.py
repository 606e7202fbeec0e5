"""Affinity and tail bench (issue 40): conversations kept on their server, and no idle tail.

All against emulator processes with the emulator's prefix cache and prefill time (10K prompt
tokens/s per server, one prefill at a time; only the uncached part is prefilled). Every case
runs the dispatcher with the new policy and with it switched off, in the same invocation,
on the same fleets, so a loaded machine weighs on both alike:

- multiturn: conversations of 1..5 user turns (mean 3) under `regeneration.turns: all` on 4
  and 8 servers, affinity on / off. Output tok/s over the whole run (completion tokens / wall),
  prefill tokens the servers computed (`sglang:prompt_tokens_total` - `sglang:cached_tokens_total`
  from /metrics), the prompt tokens served from the cache, and the share of later turns
  answered by the server that answered the turn before (from the rows' per-turn `server`).
- balance: single-turn prompts on an even fleet and on one with a server at half speed,
  hedging on / off: the steady-window capacity ratio benches/dispatch.py reports (targets
  >= 0.97 even, >= 0.95 slow), so the tail's hedges cost the steady state nothing.
- tail: the issue's case, 2,000 prompts at full size (reasoning 200:4000, answer 20:800
  tokens, max_tokens 4096) on 4 servers x 16 slots, one at half speed, hedging on / off, on
  servers that sample by a row's seed (a hedged copy is the same draw: every row holds the
  tokens the unhedged run gave it, `rows_unlike_unhedged`, 0).
  `generation_to_ideal` = the fleet's ideal time (the rows' completion tokens over the fleet's
  capacity: every slot decoding at its server's speed) / the wall from the first shard
  submitted (shards of 500, all at once, as the flow does) to the last row returned. The
  dispatcher alone: the canary's pause is the live gate's (benches/live_gate.py). Beside
  it, `perfect_dispatch_bound`: the same figure for a dispatcher with no overhead at all on
  the very answers of the run (`fifo_bound`), what the last wave's drain costs anyway.

    .venv/bin/python benches/affinity.py [--smoke] [--time-scale 0.05] [--repeats 1]
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from benches.dispatch import (
    KEY,
    MODEL,
    SHARD,
    Scraper,
    Setup,
    conversation_frame,
    fleet,
    prompt_frame,
    scrape,
)
from regen.client import Dispatcher, DispatchTuning
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig
from regen.sglang_api.endpoint import Endpoint

ON_OFF = {"on": True, "off": False}
# The tail's policies: hedging off, on (the default: a straggler as soon as a faster server
# has a free slot), and on once a request has run half its server's mean request time.
TAIL = {
    "off": DispatchTuning(hedge=False),
    "on": DispatchTuning(hedge=True),
    "on_after_0.5": DispatchTuning(hedge=True, hedge_after=0.5),
}


def _logs(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _setup(servers: int, slots: int, a: argparse.Namespace, **lengths: str) -> Setup:
    return Setup(
        servers=servers, slots=slots, requests=0, baseline_requests=0, slow_requests=0,
        multiturn_conversations=0, rss_prompts=0, rss_stream_shards=0,
        time_scale=a.time_scale, tokens_per_s=250.0, max_tokens=4096,
        reasoning=lengths.get("reasoning", "200:4000"), answer=lengths.get("answer", "20:800"),
    )  # fmt: skip


def _cache_counters(endpoints: list[Endpoint]) -> tuple[float, float]:
    """(prompt tokens, of which cached), summed over the fleet's /metrics."""
    metrics = [scrape(e) for e in endpoints]
    prompt = sum(m["sglang:prompt_tokens_total"] for m in metrics)
    cached = sum(m.get("sglang:cached_tokens_total", 0.0) for m in metrics)
    return prompt, cached


def _run(
    setup: Setup,
    endpoints: list[Endpoint],
    frame: pl.DataFrame,
    tuning: DispatchTuning,
    regeneration: RegenerationConfig | None = None,
    *,
    scraper: bool = False,
) -> tuple[pl.DataFrame, float, Any, list[tuple[float, float, float, int]]]:
    """Every shard submitted at once; (rows, wall seconds, final stats, /metrics samples)."""
    shards = [frame.slice(at, SHARD) for at in range(0, frame.height, SHARD)]
    with Dispatcher(
        endpoints,
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=setup.max_tokens),
        generation=GenerationConfig(),
        concurrency_per_server=setup.slots,
        regeneration=regeneration,
        tuning=tuning,
    ) as d:
        samples: list[tuple[float, float, float, int]] = []
        if scraper:
            with Scraper(endpoints, d) as sc:
                start = time.monotonic()
                futures = [d.submit_shard(k, rows) for k, rows in enumerate(shards)]
                out = pl.concat([f.result() for f in futures])
                wall = time.monotonic() - start
            samples = sc.samples
        else:
            start = time.monotonic()
            futures = [d.submit_shard(k, rows) for k, rows in enumerate(shards)]
            out = pl.concat([f.result() for f in futures])
            wall = time.monotonic() - start
        stats = d.stats()
    assert out.height == frame.height and out["id"].n_unique() == frame.height, "rows lost"
    return out, wall, stats, samples


def long_conversations(n: int, turns: int = 5) -> pl.DataFrame:
    """n conversations of a system message and `turns` user messages."""
    frame = conversation_frame(n, prefix="l")
    user = pl.int_ranges(0, turns).list.eval(
        pl.struct(
            role=pl.lit("user"),
            content=pl.format("Next step {}: explain and give the answer", pl.element()),
        )
    )
    return frame.with_columns(messages=pl.concat_list(pl.col("messages").list.first(), user)).cast(
        frame.schema
    )


def multiturn(a: argparse.Namespace, servers: int, root: Path, kind: str) -> dict[str, Any]:
    """kind full: more conversations than slots (the fleet saturated until the last wave);
    sparse: half as many 5-turn conversations as the fleet has slots (long agentic sessions)."""
    setup = _setup(servers, a.slots, a)
    if kind == "full":
        frame = conversation_frame(a.conversations * servers // 4)
    else:
        frame = long_conversations(servers * a.slots // 2)
    result: dict[str, Any] = {}
    for name, on in ON_OFF.items():
        # A fleet of its own per run: no cache carried over from the other run.
        with fleet(setup, _logs(root / f"mt-{kind}-{servers}-{name}")) as endpoints:
            out, wall, stats, _ = _run(
                setup, endpoints, frame, DispatchTuning(affinity=on),
                RegenerationConfig(turns="all"),
            )  # fmt: skip
            prompt, cached = _cache_counters(endpoints)
        turns = out["turns"].to_list()
        later = [(t[i - 1]["server"], t[i]["server"]) for t in turns for i in range(1, len(t))]
        tokens = int(out["completion_tokens"].sum())
        result[name] = {
            "conversations": out.height,
            "turns": sum(len(t) for t in turns),
            "errors": int(out["error"].is_not_null().sum()),
            "wall_s": round(wall, 2),
            "output_tok_per_s": round(tokens / wall, 1),
            "prompt_tokens": int(prompt),
            "prefill_tokens": int(prompt - cached),
            "cached_share": round(cached / prompt, 4) if prompt else 0.0,
            "same_server_share": round(sum(p == n for p, n in later) / len(later), 4),
            "home_turns": stats.home_turns,
            "moved_turns": stats.moved_turns,
        }
    return result


def _capacity_ratio(setup: Setup, samples: list[tuple[float, float, float, int]], slow: float,
                    start: float) -> float:  # fmt: skip
    """benches/dispatch.py's steady window: from one longest request after the start to the
    moment the queue runs dry."""
    dry = next((t for t, _, _, q in samples if q == 0), samples[-1][0])
    steady = [s for s in samples if start + setup.longest_s() <= s[0] <= dry]
    if len(steady) < 3:
        steady = [s for s in samples if s[0] <= dry]
    (t0, _, k0, _), (t1, _, k1, _) = steady[0], steady[-1]
    return (k1 - k0) / (t1 - t0) / setup.capacity(slow) if t1 > t0 else float("nan")


def balance(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    setup = _setup(a.balance_servers, a.slots, a)
    result: dict[str, Any] = {}
    for fleet_name, slow in (("even", None), ("slow", 0.5)):
        with fleet(setup, _logs(root / f"bal-{fleet_name}"), slow=slow) as endpoints:
            for name, on in ON_OFF.items():
                frame = prompt_frame(a.balance_prompts, prefix=f"{fleet_name}-{name}")
                start = time.monotonic()
                _, _, stats, samples = _run(
                    setup, endpoints, frame, DispatchTuning(hedge=on), scraper=True
                )
                ratio = _capacity_ratio(setup, samples, slow or 1.0, start)
                result[f"{fleet_name}_hedge_{name}"] = {
                    "capacity_ratio": round(ratio, 4), "hedged": stats.hedged
                }  # fmt: skip
    return result


def fifo_bound(lengths: list[int], speeds: list[float], slots: int, hedge: bool) -> float:
    """generation / ideal of a perfect dispatcher on these very answers (no overhead, no
    network): rows in order, each to the first free slot; with `hedge`, once the last row has
    started, each free fast slot copies the slow server's latest-finishing request, which then
    ends at the earlier of its two finishes. What the drain of the last wave costs anyway."""
    free = [(0.0, s) for s in range(len(speeds)) for _ in range(slots)]
    heapq.heapify(free)
    jobs = []
    for n in lengths:
        t, s = heapq.heappop(free)
        jobs.append((t, t + n / speeds[s], s, n))
        heapq.heappush(free, (jobs[-1][1], s))
    dry = jobs[-1][0]
    fast = max(speeds)
    tail = [j for j in jobs if hedge and speeds[j[2]] < fast and j[1] > dry]
    end = max((j[1] for j in jobs if j not in tail), default=0.0)
    spare = sorted(max(t, dry) for t, s in free if speeds[s] == fast)
    for j in sorted(tail, key=lambda j: -j[1]):
        end = max(end, min(j[1], spare.pop(0) + j[3] / fast) if spare else j[1])
    ideal = sum(lengths) / (slots * sum(speeds))
    return ideal / end


def tail(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Each policy on the same prompts, on servers that sample by a row's seed (one model,
    `same_draws`): a hedged copy is the same draw, so every row must hold exactly the tokens
    the run without hedging gave it (`rows_unlike_unhedged`), whichever copy answered first."""
    setup = _setup(a.tail_servers, a.slots, a)
    runs: dict[str, list[dict[str, Any]]] = {}
    for fleet_name, slow in (("slow", 0.5), ("even", None)):
        policies = list(TAIL) if slow else ["on", "off"]
        with fleet(setup, _logs(root / f"tail-{fleet_name}"), slow=slow, same_draws=True) as (
            endpoints
        ):
            for k in range(a.repeats):
                frame = prompt_frame(a.tail_prompts, prefix=f"t{k}")
                answers: dict[str, pl.DataFrame] = {}
                # The order flips every repeat, so no policy always runs first.
                for name in policies if k % 2 == 0 else policies[::-1]:
                    out, wall, stats, _ = _run(setup, endpoints, frame, TAIL[name])
                    answers[name] = out.select("id", "completion_tokens", "content").sort("id")
                    tokens = int(out["completion_tokens"].sum())
                    ideal = tokens / setup.capacity(slow or 1.0)
                    speeds = [slow or 1.0] + [1.0] * (setup.servers - 1)
                    lengths = out["completion_tokens"].to_list()
                    bound = fifo_bound(lengths, speeds, setup.slots, TAIL[name].hedge)
                    runs.setdefault(f"{fleet_name}_hedge_{name}", []).append({
                        "wall_s": round(wall, 2), "ideal_s": round(ideal, 2),
                        "generation_to_ideal": round(ideal / wall, 4),
                        "perfect_dispatch_bound": round(bound, 4),
                        "hedged": stats.hedged, "hedge_wins": stats.hedge_wins,
                        "errors": int(out["error"].is_not_null().sum()),
                    })  # fmt: skip
                off = answers.get("off")
                for name, got in answers.items():
                    if off is not None and name != "off":
                        unlike = got.join(off, on="id", suffix="_off").filter(
                            (pl.col("completion_tokens") != pl.col("completion_tokens_off"))
                            | (pl.col("content") != pl.col("content_off"))
                        )
                        runs[f"{fleet_name}_hedge_{name}"][-1]["rows_unlike_unhedged"] = (
                            unlike.height
                        )
    return {
        name: {
            "generation_to_ideal": statistics.median(r["generation_to_ideal"] for r in rs),
            "perfect_dispatch_bound": statistics.median(r["perfect_dispatch_bound"] for r in rs),
            "runs": rs,
        }
        for name, rs in runs.items()
    }


def print_tables(result: dict[str, Any]) -> None:
    print("multi-turn, turns: all (full: conversations of 1..5 user turns, more than slots; "
          "sparse: 5-turn conversations, half the fleet's slots)")  # fmt: skip
    print(f"{'servers':>9} {'affinity':>8} {'conv':>6} {'turns':>6} {'wall_s':>7} "
          f"{'tok/s':>9} {'prefill_tok':>12} {'cached':>7} {'same_srv':>8} "
          f"{'errors':>6}")  # fmt: skip
    for servers, by in result["multiturn"].items():
        for name, r in by.items():
            print(f"{servers:>9} {name:>8} {r['conversations']:>6} {r['turns']:>6} "
                  f"{r['wall_s']:>7.1f} {r['output_tok_per_s']:>9.0f} "
                  f"{r['prefill_tokens']:>12,} {r['cached_share']:>7.1%} "
                  f"{r['same_server_share']:>8.1%} {r['errors']:>6}")  # fmt: skip
    print()
    print("single-turn balance (steady-window capacity ratio; targets >= 0.97 even, >= 0.95 slow)")
    for name, r in result["balance"].items():
        print(f"  {name:16} {r['capacity_ratio']:.3f}  (hedged {r['hedged']})")
    print()
    t = result["setup"]
    print(f"tail: {t['tail_prompts']:,} prompts, {t['tail_servers']} servers x {t['slots']} slots "
          "(slow: server-0 at half speed); generation / ideal (target >= 0.97 slow)")  # fmt: skip
    for name, r in result["tail"].items():
        each = ", ".join(f"{x['generation_to_ideal']:.3f}" for x in r["runs"])
        hedged = ", ".join(f"{x['hedged']}/{x['hedge_wins']}" for x in r["runs"])
        unlike = [x["rows_unlike_unhedged"] for x in r["runs"] if "rows_unlike_unhedged" in x]
        same = f"; rows unlike the unhedged run's {unlike}" if unlike else ""
        bound = r["perfect_dispatch_bound"]
        print(f"  {name:24} {r['generation_to_ideal']:.3f}  (runs {each}; hedged/won {hedged}; "
              f"perfect dispatch of its answers {bound:.3f}{same})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="seconds: checks that it runs")
    p.add_argument("--time-scale", type=float, default=0.2, help="wall s per simulated s")
    p.add_argument("--repeats", type=int, default=1, help="tail runs of each policy")
    p.add_argument("--cases", nargs="+", default=["multiturn", "balance", "tail"])
    a = p.parse_args()
    a.slots, a.conversations, a.tail_servers, a.tail_prompts = 16, 400, 4, 2000
    a.balance_servers, a.balance_prompts, a.multiturn_fleets = 4, 1000, (4, 8)
    if a.smoke:  # two fleet sizes still, each half: a server launched is most of a smoke run
        a.slots, a.conversations, a.tail_prompts, a.balance_prompts = 4, 24, 64, 64
        a.tail_servers, a.balance_servers, a.multiturn_fleets = 2, 2, (2, 4)
        a.time_scale = min(a.time_scale, 0.01)
    result: dict[str, Any] = {
        "setup": {k: v for k, v in vars(a).items() if k != "cases"},
        "multiturn": {}, "balance": {}, "tail": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="regen-affinity-bench-") as tmp:
        root = Path(tmp)
        if "multiturn" in a.cases:
            for kind in ("full", "sparse"):
                for servers in a.multiturn_fleets:
                    key = f"{servers} {kind}"
                    result["multiturn"][key] = multiturn(a, servers, root, kind)
        if "balance" in a.cases:
            result["balance"] = balance(a, root)
        if "tail" in a.cases:
            result["tail"] = tail(a, root)
    path = results_path("affinity", smoke=a.smoke)
    if path.exists() and set(a.cases) != {"multiturn", "balance", "tail"}:
        # A rerun of some cases keeps the others' figures.
        saved = json.loads(path.read_text())
        result = {**saved, **{k: v for k, v in result.items() if k in a.cases}}
    print_tables(result)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
