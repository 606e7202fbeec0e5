"""Scale: the real flow on N synthetic prompts, measured stage by stage (issue 22).

A child process runs `flows.runner.run_regenerate` on a rehearsal config, the code path of
`regen rehearse`, with a fresh ephemeral Prefect (its own PREFECT_HOME, as a new user has).
The emulators answer with no simulated decode time (time scale 1e-4), so what is measured is
the client, the storage and the orchestration, not simulated GPUs; their answers have the
emulator's default lengths (`--texts short`: a few tokens, the dataset's size out of the way).
It records:

- wall per stage from Prefect's own task runs (provision, stage-model, plan-shards,
  launch-fleet, generate = first shard task start to last shard task end, audit), the
  Prefect start (process start to flow start) and the whole child process end to end;
- peak RSS of the flow process (VmHWM; also sampled every 50 ms) and its peak while the
  plan stage ran, beside its RSS when the plan started;
- Prefect's share: a second child runs the same library stage on the same prompts
  (`regen.generation.generate.generate_plan`: canary, shards, commits, per-shard audit
  summaries, live gate) with each shard on a thread of a 32-wide pool (the flow's task
  runner) instead of a Prefect task; the difference of the two generation walls per shard
  is what a shard task costs;
- the Prefect database and artifacts after the run, and every id exactly once, read from the
  committed shards named by their manifests, against the input ids.

    python benches/scale.py [--prompts 1000000] [--servers 4] [--shard-size 500] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path

STAGES = ("provision", "stage-model", "plan-shards", "launch-fleet", "generate", "audit")
THREADS = 32  # flows/regenerate.py: ThreadPoolTaskRunner(max_workers=32)


def write_prompts(path: Path, rows: int) -> None:
    """`rows` one-turn chat prompts with ids p0000000..; written by polars, not a row loop."""
    idx = pl.int_range(0, rows, eager=True)
    frame = pl.DataFrame({"i": idx}).select(
        id=pl.format("p{}", pl.col("i").cast(pl.String).str.zfill(7)),
        messages=pl.concat_list(
            pl.struct(
                role=pl.lit("user"),
                content=pl.format(
                    "Explain in a few sentences what is special about the number {}.", "i"
                ),
            )
        ),
    )
    frame.write_ndjson(path)


def write_config(path: Path, work: Path, args: argparse.Namespace) -> Path:
    data: dict[str, Any] = {
        "work_dir": str(work),
        "shard_size": args.shard_size,
        "engine": {
            "startup_timeout_s": 120,
            "bench": {"concurrency": 4, "max_tokens": 16, "budget_s": 5},
            # No simulated decode time to speak of: the client and orchestration are measured.
            "emulator": {"load_s": 0, "time_scale": 0.0001},
        },
    }
    if args.texts == "short":
        data["engine"]["emulator"] |= {"reasoning_tokens": "10:40", "answer_tokens": "10:40"}
    path.write_text(yaml.safe_dump(data))
    return path


class RssSampler(threading.Thread):
    """This process's RSS and CPU seconds every `interval_s`, and the machine's busy CPU share
    (so a figure limited by a saturated machine can be told from one limited by the design)."""

    def __init__(self, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        # time, process CPU s, machine CPU %, CPU s of the children by kind
        self.cpu: list[tuple[float, float, float, dict[str, float]]] = []
        self._done = threading.Event()
        self._proc = psutil.Process()

    def run(self) -> None:
        psutil.cpu_percent()
        tick = 0
        while not self._done.is_set():
            now = time.time()
            self.samples.append((now, self._proc.memory_info().rss))
            if tick % 10 == 0:  # every 0.5 s: cpu_percent over a shorter span is noise
                times = self._proc.cpu_times()
                own = times.user + times.system
                self.cpu.append((now, own, psutil.cpu_percent(), self._children_cpu()))
            tick += 1
            self._done.wait(self.interval_s)

    def _children_cpu(self) -> dict[str, float]:
        """CPU seconds so far of the processes below this one: the emulators and, in the flow,
        Prefect's temporary API server (its work competes for the same two cores)."""
        kinds: dict[str, float] = {}
        for child in self._proc.children(recursive=True):
            try:
                cmdline = " ".join(child.cmdline())
                times = child.cpu_times()
            except psutil.Error:
                continue
            kind = "emulators" if "regen.emulator" in cmdline else "prefect server" if (
                "uvicorn" in cmdline or "prefect" in cmdline
            ) else "other"  # fmt: skip
            kinds[kind] = kinds.get(kind, 0.0) + times.user + times.system
        return kinds

    def cpu_in(self, start: float, end: float) -> tuple[float, float, dict[str, float]]:
        """This process's CPU seconds, the machine's mean busy % and the CPU seconds of its
        children by kind between two moments."""
        inside = [c for c in self.cpu if start <= c[0] <= end]
        if len(inside) < 2:
            return 0.0, 0.0, {}
        busy = sum(c[2] for c in inside[1:]) / (len(inside) - 1)
        first, last = inside[0][3], inside[-1][3]
        kids = {k: round(v - first.get(k, 0.0), 1) for k, v in last.items()}
        return round(inside[-1][1] - inside[0][1], 2), round(busy, 1), kids

    def stop(self) -> None:
        self._done.set()
        self.join()

    def peak_mb(self, start: float = 0.0, end: float = float("inf")) -> float:
        inside = [rss for t, rss in self.samples if start <= t <= end]
        return round(max(inside, default=0) / 2**20, 1)

    def at_mb(self, moment: float) -> float:
        before = [rss for t, rss in self.samples if t <= moment]
        return round((before[-1] if before else 0) / 2**20, 1)


def _task_windows(flow_run_id: Any) -> tuple[dict[str, tuple[float, float]], int]:
    """Start and end of each stage from Prefect's task runs; shard tasks merge into one."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    windows: dict[str, tuple[float, float]] = {}
    shards = 0
    with get_client(sync_client=True) as client:
        offset = 0
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                offset=offset,
                limit=200,
            )
            for run in runs:
                if run.start_time is None or run.end_time is None:
                    continue
                # Run names are the task's name and a suffix: "plan-shards-3a1", "audit-235".
                shard_task = run.name.startswith("generate-shard")
                name = "generate" if shard_task else run.name.rsplit("-", 1)[0]
                shards += name == "generate"
                start, end = run.start_time.timestamp(), run.end_time.timestamp()
                old = windows.get(name, (start, end))
                windows[name] = (min(old[0], start), max(old[1], end))
            if len(runs) < 200:
                break
            offset += len(runs)
    return windows, shards


def _artifacts(flow_run_id: Any) -> dict[str, int]:
    """This run's artifacts (its progress artifact is one, updated in place)."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])),
            limit=200,
        )
    return {
        "count": len(found),
        "bytes": sum(len(json.dumps(a.data, default=str)) for a in found),
    }


def _high_water_mb() -> float:
    """VmHWM, this process's own peak RSS (ru_maxrss can carry the parent's from before exec)."""
    status = Path("/proc/self/status").read_text()
    kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))
    return round(int(kb) / 1024, 1)


def flow_child(config_path: Path, prompts: Path, out: Path, servers: int, result: Path) -> None:
    """Run the flow as `regen rehearse` does, in this process, and write what it measured."""
    started = psutil.Process().create_time()
    sampler = RssSampler()
    sampler.start()
    from flows.cli import prefect_env
    from flows.runner import run_regenerate
    from regen.rehearsal import rehearsal_config

    prefect_env()
    config = rehearsal_config(
        config_path=config_path, prompts=str(prompts), out=str(out), servers=servers
    )
    rc = run_regenerate(config)
    ended = time.time()
    sampler.stop()
    from prefect import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=1)
    windows, shards = _task_windows(flow_run.id)
    plan = windows.get("plan-shards", (0.0, 0.0))
    gen_cpu_s, gen_machine_pct, gen_children = sampler.cpu_in(*windows.get("generate", (0.0, 0.0)))
    flow_start = flow_run.start_time.timestamp() if flow_run.start_time else started
    measured = {
        "rc": rc,
        "e2e_s": ended - started,
        "prefect_start_s": flow_start - started,
        "stage_s": {k: round(v[1] - v[0], 3) for k, v in windows.items()},
        "shard_tasks": shards,
        "flow_peak_rss_mb": _high_water_mb(),
        "flow_peak_rss_sampled_mb": sampler.peak_mb(),
        "plan_peak_rss_mb": sampler.peak_mb(*plan),
        "stage_peak_rss_mb": {k: sampler.peak_mb(*v) for k, v in windows.items()},
        "plan_start_rss_mb": sampler.at_mb(plan[0]),
        "generate_cpu_s": gen_cpu_s,
        "generate_machine_cpu_pct": gen_machine_pct,
        "generate_children_cpu_s": gen_children,
        "artifacts": _artifacts(flow_run.id),
    }
    result.write_text(json.dumps(measured))


def plain_child(config_path: Path, prompts: Path, out: Path, servers: int, result: Path) -> None:
    """The same rows through the same library stage with no Prefect at all: plan, then
    `regen.generation.generate.generate_plan` (canary, shards, commits, each shard's audit
    summary and the live gate), each shard started on a thread of a pool as wide as the
    flow's task runner instead of as a Prefect task."""
    from regen.fleet import build_server_commands, generate_api_key, launch_fleet
    from regen.generation.feed import feeding
    from regen.generation.generate import generate_plan
    from regen.generation.loop import AllPending
    from regen.generation.outcome import ShardOutcome
    from regen.generation.run_plan import plan_run
    from regen.generation.shard import Fence, OnCommit, RowSource, generate_shard
    from regen.rehearsal import rehearsal_config
    from regen.run import OpenedRun

    config = rehearsal_config(
        config_path=config_path, prompts=str(prompts), out=str(out), servers=servers
    )
    run = OpenedRun(config)
    plan = plan_run(config, run.storage)
    key = generate_api_key()
    model_path = config.model.staged_path()  # staged by the flow child, same work dir
    tokenizer = str(config.model.tokenizer_path or model_path)
    commands = build_server_commands(config, model_path, key, config.work_dir / "plain")
    first_start: list[float] = []
    sampler = RssSampler()
    source = AllPending()
    with (
        launch_fleet(config, commands, key) as fleet,
        ThreadPoolExecutor(THREADS) as pool,
        feeding(
            config,
            run.storage,
            plan,
            fleet,
            key,
            progress_key=source.progress_key,
            on_live=lambda _: None,
        ) as feed,
    ):

        def start(
            shard: int, lease: Fence | None, rows: RowSource, on_commit: OnCommit, retry: bool
        ) -> Future[ShardOutcome]:
            first_start.append(time.time())
            return pool.submit(
                generate_shard, shard, plan, rows, run.storage, retry_errors=retry, lease=lease,
                on_commit=on_commit,
            )  # fmt: skip

        sampler.start()
        summary = generate_plan(run, plan, feed, start, source, tokenizer_path=tokenizer)
        end = time.time()
        sampler.stop()
    begin = min(first_start)
    cpu_s, machine_pct, children = sampler.cpu_in(begin, end)
    measured: dict[str, Any] = {
        "generate_s": end - begin,
        "rows": summary.rows,
        "shards": len(first_start),
        "generate_cpu_s": cpu_s,
        "generate_machine_cpu_pct": machine_pct,
        "generate_children_cpu_s": children,
    }
    result.write_text(json.dumps(measured))


def exactly_once(prompts: Path, out: Path) -> dict[str, Any]:
    """Every input id once in the committed shards the manifests name; counts of what is not."""
    from regen.dataset import read_committed
    from regen.storage import LocalStorage

    got = read_committed(LocalStorage(out)).scan().select("id")
    want = pl.scan_ndjson(prompts).select("id")
    lost = want.join(got, on="id", how="anti").select(pl.len()).collect().item()
    extra = got.join(want, on="id", how="anti").select(pl.len()).collect().item()
    doubled = got.group_by("id").len().filter(pl.col("len") > 1).select(pl.len()).collect().item()
    rows = got.select(pl.len()).collect().item()
    return {"rows": rows, "lost": lost, "doubled": doubled, "unknown": extra}


def _child(mode: str, args: list[str], env: dict[str, str], log: Path, work_dir: Path) -> None:
    """One measured child; it, its descendants and the servers it recorded under `work_dir`
    are killed on any exit (an interrupted bench must not leave a fleet running)."""
    from support.chaos import reaping

    cmd = [sys.executable, __file__, f"--{mode}", *args]
    with reaping(work_dir) as reaper, log.open("ab") as fh:
        proc = reaper.started(
            subprocess.Popen(
                cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        returncode = proc.wait()
    if returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"scale: the {mode} child exited {returncode}:\n{tail}")


def _size_mb(path: Path) -> float:
    files = [path] if path.is_file() else path.rglob("*")
    return round(sum(p.stat().st_size for p in files if p.is_file()) / 2**20, 1)


@contextmanager
def _workspace(keep: bool) -> Iterator[Path]:
    if keep:
        yield Path(tempfile.mkdtemp(prefix="regen-scale-"))
        return
    with tempfile.TemporaryDirectory(prefix="regen-scale-") as tmp:
        yield Path(tmp)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with _workspace(args.keep) as root:
        prompts = root / "prompts.jsonl"
        home = args.prefect_home or root / "prefect-home"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_HOME=str(home), PYTHONUNBUFFERED="1")
        t = time.perf_counter()
        write_prompts(prompts, args.prompts)
        print(f"wrote {args.prompts:,} prompts in {time.perf_counter() - t:.1f} s", flush=True)
        config = write_config(root / "regen.yaml", root / "work", args)
        flow_json, plain_json = root / "flow.json", root / "plain.json"
        common = [str(config), str(prompts)]
        _child("flow", [*common, str(root / "out"), str(args.servers), str(flow_json)], env,
               root / "flow.log", root / "work")  # fmt: skip
        flow = json.loads(flow_json.read_text())
        once = exactly_once(prompts, root / "out")
        plain: dict[str, Any] = {}
        if not args.no_baseline:
            _child("plain", [*common, str(root / "plain-out"), str(args.servers), str(plain_json)],
                   env, root / "plain.log", root / "work")  # fmt: skip
            plain = json.loads(plain_json.read_text())
        db = sum(_size_mb(p) for p in home.glob("prefect.db*"))
        if args.keep:
            print(f"kept {root}")
    stage = {name: flow["stage_s"].get(name) for name in STAGES}
    gen_s = stage["generate"] or 0.0
    shards = flow["shard_tasks"]
    prefect_s = gen_s - plain["generate_s"] if plain else None
    return {
        "prompts": args.prompts,
        "servers": args.servers,
        "shard_size": args.shard_size,
        "texts": args.texts,
        "shards": shards,
        "wall_s": round(flow["e2e_s"], 2),
        "prefect_start_s": round(flow["prefect_start_s"], 2),
        "stage_s": stage,
        "flow_peak_rss_mb": flow["flow_peak_rss_mb"],
        "plan_peak_rss_mb": flow["plan_peak_rss_mb"],
        "plan_start_rss_mb": flow["plan_start_rss_mb"],
        "stage_peak_rss_mb": {name: flow["stage_peak_rss_mb"].get(name) for name in STAGES},
        "plain_generate_s": round(plain["generate_s"], 2) if plain else None,
        "prefect_ms_per_shard": (
            round(1000 * prefect_s / shards, 1) if prefect_s is not None and shards else None
        ),
        "prefect_share_pct": (
            round(100 * prefect_s / gen_s, 1) if prefect_s is not None and gen_s else None
        ),
        "generate_cpu_s": flow["generate_cpu_s"],
        "plain_generate_cpu_s": plain.get("generate_cpu_s"),
        "prefect_cpu_ms_per_shard": (
            round(1000 * (flow["generate_cpu_s"] - plain["generate_cpu_s"]) / shards, 1)
            if plain and shards
            else None
        ),
        "machine_cpu_pct_generate": flow["generate_machine_cpu_pct"],
        "children_cpu_s_generate": flow["generate_children_cpu_s"],
        "children_cpu_s_plain": plain.get("generate_children_cpu_s"),
        "machine_cpu_pct_plain": plain.get("generate_machine_cpu_pct"),
        "prefect_db_mb": round(db, 1),
        "prefect_artifacts": flow["artifacts"],
        "audit_s": stage["audit"],
        "rows_per_s_generate": round(args.prompts / gen_s) if gen_s else None,
        "exactly_once": once["rows"] == args.prompts
        and not (once["lost"] or once["doubled"] or once["unknown"]),
        "ids": once,
        "flow_rc": flow["rc"],
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "smoke": args.smoke,
    }


def print_table(result: dict[str, Any]) -> None:
    rows: list[tuple[str, Any]] = [
        ("prompts", f"{result['prompts']:,} ({result['texts']} texts)"),
        ("shards (tasks)", result["shards"]),
        ("end to end (s)", result["wall_s"]),
        ("  Prefect start (s)", result["prefect_start_s"]),
        *((f"  {k} (s)", v) for k, v in result["stage_s"].items()),
        ("flow peak RSS (MB)", result["flow_peak_rss_mb"]),
        ("plan peak RSS (MB)", result["plan_peak_rss_mb"]),
        ("  RSS at plan start (MB)", result["plan_start_rss_mb"]),
        *((f"  peak RSS in {k} (MB)", v) for k, v in result["stage_peak_rss_mb"].items()),
        ("generate without Prefect (s)", result["plain_generate_s"]),
        ("Prefect ms per shard task", result["prefect_ms_per_shard"]),
        ("Prefect share of generation (%)", result["prefect_share_pct"]),
        (
            "flow CPU in generate / plain (s)",
            (result["generate_cpu_s"], result["plain_generate_cpu_s"]),
        ),
        ("Prefect CPU ms per shard task", result["prefect_cpu_ms_per_shard"]),
        (
            "machine CPU % in generate / plain",
            (result["machine_cpu_pct_generate"], result["machine_cpu_pct_plain"]),
        ),
        ("children CPU s in generate", result["children_cpu_s_generate"]),
        ("children CPU s in plain", result["children_cpu_s_plain"]),
        ("Prefect DB (MB)", result["prefect_db_mb"]),
        ("Prefect artifacts", result["prefect_artifacts"]),
        ("rows exactly once", result["exactly_once"]),
        ("load average at end (1 min)", result["load_avg_1m_at_end"]),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--shard-size", type=int, default=500)
    parser.add_argument("--smoke", action="store_true", help="1,000 prompts, 2 servers")
    parser.add_argument(
        "--texts",
        choices=["full", "short"],
        default="full",
        help="full: the emulator's answer lengths (reasoning 200-4000 tokens, answer 20-800), "
        "as a rehearsal writes; short: 10-40 tokens each (the dataset's size out of the way)",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the no-Prefect run")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    parser.add_argument(
        "--prefect-home",
        type=Path,
        help="reuse this PREFECT_HOME (set up already: no database set-up in the figures, "
        "but its size includes earlier runs)",
    )
    parser.add_argument("--flow", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--plain", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for mode, child in (("flow", flow_child), ("plain", plain_child)):
        if getattr(args, mode):
            config, prompts, out, servers, result = getattr(args, mode)
            child(Path(config), Path(prompts), Path(out), int(servers), Path(result))
            return 0
    if args.smoke:
        args.prompts, args.servers, args.shard_size, args.texts = 1000, 2, 100, "short"
    result = run(args)
    print_table(result)
    path = results_path("scale", smoke=args.smoke)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")
    return 0 if result["exactly_once"] and result["flow_rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
