"""Multi-node scaling: one dataset on 1, 2 and 4 emulated GPU nodes, same total load each time.

Does adding nodes shorten a run as it should? Every case runs `regenerate-multinode/multinode`
as a user starts it (`prefect deployment run`) against one `prefect server`, one moto S3
(real S3 API on loopback: claims, leases and manifests go through the same code as on AWS;
a fresh bucket per case) and one process worker per pool: regen-cpu for the parent and
regen-gpu-node-1..N for the nodes, all on this machine. Each node's child run launches its
own emulator server (own port, own work_dir). The emulator holds a slot for one sleep per
request, so generation is sleep-dominated and a node's throughput is its slots over the
simulated decode time, as a GPU node's would be.

Two walls per case: generation (first shard started to last shard committed, over all nodes,
from the manifests' `written_at` minus `timings["generate_s"]`) and end to end (`prefect
deployment run` until the parent is Completed: worker pick-up, process start, fleet launch
and bench, generation, audit). Speedup is over the one-node case. The machine's CPU use, and
this bench's share of it, is sampled through each case, so the result can tell a machine
limit (every "node"'s flow process, worker and emulator, the parent, the Prefect server and
moto share this host's cores) from a design one: `cpu_bound_speedup` is the most the cores
allow, given what one node's generation costs them, and `cpu_core_s_per_row` shows whether
the work per row stayed the same as nodes were added.

    python benches/multinode.py [--prompts 1200] [--shard-size 10] [--nodes 1,2,4]
                                [--time-scale 0.25] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # regen, support

from benches._common import results_path
from regen.dataset import Manifest, committed_shards
from regen.fleet import reap_orphans
from support import REPO
from support.multinode import parent_params, start_parent, write_prompts
from support.prefect import Server, prefect_server, prefect_worker
from support.s3 import MotoS3, moto_server

CPU_SAMPLE_S = 0.5


def _node_pool(i: int) -> str:
    return f"regen-gpu-node-{i}"


def _deploy(server: Server, root: Path, max_nodes: int) -> None:
    """The repo's deployments plus node-3.. (prefect.yaml has node-1 and node-2), from REPO.

    A copy of prefect.yaml with the extra node deployments is deployed with the repo as the
    working directory, so the default pull step points every worker at this checkout.
    """
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    template = next(d for d in spec["deployments"] if d["name"] == "node-1")
    known = {d["name"] for d in spec["deployments"]}
    for i in range(1, max_nodes + 1):
        if f"node-{i}" not in known:
            extra = {**template, "name": f"node-{i}", "work_pool": {"name": _node_pool(i)}}
            spec["deployments"].append(extra)
    prefect_file = root / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    server.prefect("--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file), cwd=REPO)


def _create_pools(server: Server, max_nodes: int) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate

    pools = ["regen-cpu", "regen-gpu", *(_node_pool(i) for i in range(1, max_nodes + 1))]
    with server.client() as client:
        for pool in pools:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))


def _wait_workers_online(server: Server, pools: list[str], timeout: float = 120) -> None:
    """Until every pool has a worker that has sent a heartbeat, so no case pays its start."""
    deadline = time.monotonic() + timeout
    with server.client() as client:
        waiting = list(pools)
        while waiting and time.monotonic() < deadline:
            waiting = [
                p
                for p in waiting
                if not any(w.status == "ONLINE" for w in client.read_workers_for_work_pool(p))
            ]
            time.sleep(0.5)
    if waiting:
        raise RuntimeError(f"no worker online for pool(s) {waiting} after {timeout:.0f} s")


class CpuSampler:
    """The machine's CPU %, and this bench's share of it, every CPU_SAMPLE_S, timestamped.

    Both are of all cores (100 = every core busy). The bench's share is the CPU time of this
    process and all its descendants (moto, server, workers, flow runs, emulators), so what
    other processes on the host took is the difference.
    """

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cores = psutil.cpu_count() or 1

    @staticmethod
    def _tree_cpu() -> dict[tuple[int, float], float]:
        me = psutil.Process()
        used = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                used[(proc.pid, proc.create_time())] = times.user + times.system
            except psutil.Error:
                continue
        return used

    def _run(self) -> None:
        psutil.cpu_percent(interval=None)
        seen, last = self._tree_cpu(), time.monotonic()
        while not self._stop.wait(CPU_SAMPLE_S):
            total = psutil.cpu_percent(interval=None)
            now, tree = time.monotonic(), self._tree_cpu()
            # A process new since the last sample started within it: all its CPU counts.
            delta = sum(cpu - seen.get(key, 0.0) for key, cpu in tree.items())
            mine = min(total, 100.0 * delta / (now - last) / self._cores)
            self.samples.append((time.time(), total, mine))
            seen, last = tree, now

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self, start: float, end: float) -> tuple[float | None, float | None]:
        """Mean machine CPU % and the bench's share over [start, end] (epoch seconds)."""
        window = [(total, mine) for at, total, mine in self.samples if start <= at <= end]
        if not window:
            return None, None
        return (
            round(statistics.fmean(t for t, _ in window), 1),
            round(statistics.fmean(m for _, m in window), 1),
        )


def _params(
    s3: MotoS3, case_dir: Path, prompts: Path, nodes: int, args: argparse.Namespace
) -> tuple[dict[str, Any], str]:
    """The parent's parameters for one case, with a bucket and node work_dirs of its own."""
    bucket = s3.create_bucket("regen-bench")
    emulator = {
        "time_scale": args.time_scale,
        "tokens_per_s": args.tokens_per_s,
        "reasoning_tokens": args.reasoning_tokens,
        "answer_tokens": args.answer_tokens,
    }
    params = parent_params(
        case_dir,
        bucket,
        prompts,
        {f"node-{i}": {} for i in range(1, nodes + 1)},
        shard_size=args.shard_size,
        emulator=emulator,
        lease_s=args.lease_s,
        concurrency=args.concurrency,
    )
    return params, bucket


def _wait_final(server: Server, run_id: str, timeout: float) -> tuple[str | None, str | None]:
    """The parent's final state name and message, or ('TimedOut', last state) after timeout."""
    run = server.wait_final(run_id, timeout)
    if run.state is None or not run.state.is_final():
        return "TimedOut", run.state_name
    return run.state.name, run.state.message


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _spans(manifests: dict[int, Manifest]) -> dict[str, dict[str, float]]:
    """Per node: first shard started, last committed (epoch s), shards and rows."""
    spans: dict[str, dict[str, float]] = {}
    for m in manifests.values():
        end = _stamp(m.written_at)
        start = end - m.timings["generate_s"]
        node = m.node or ""
        span = spans.setdefault(node, {"start": start, "end": end, "shards": 0, "rows": 0})
        span["start"], span["end"] = min(span["start"], start), max(span["end"], end)
        span["shards"] += 1
        span["rows"] += m.rows
    return spans


def _case(
    s3: MotoS3, server: Server, root: Path, prompts: Path, nodes: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One run on `nodes` nodes, measured; its emulators reaped whatever happened."""
    case_dir = root / f"nodes-{nodes}"
    case_dir.mkdir()
    params, bucket = _params(s3, case_dir, prompts, nodes, args)
    try:
        with CpuSampler() as cpu:
            started_at, started = time.time(), time.monotonic()
            run_id = start_parent(server, params)
            state, message = _wait_final(server, run_id, args.case_timeout)
            e2e_s, ended_at = time.monotonic() - started, time.time()
    finally:
        for node in params["nodes"]:
            reap_orphans(Path(node["work_dir"]))
    storage = s3.storage(bucket, "run")
    fingerprint = json.loads(storage.read_bytes("run.json"))["fingerprint"]
    manifests = committed_shards(storage, fingerprint)
    spans = _spans(manifests)
    result: dict[str, Any] = {
        "nodes": nodes,
        "parent_state": state,
        "parent_message": message if state != "Completed" else None,
        "shards_committed": len(manifests),
        "rows_committed": sum(m.rows for m in manifests.values()),
        "e2e_wall_s": round(e2e_s, 2),
    }
    result["cpu_pct_e2e"], result["bench_cpu_pct_e2e"] = cpu.mean(started_at, ended_at)
    if spans:
        first = min(s["start"] for s in spans.values())
        last = max(s["end"] for s in spans.values())
        result["cpu_pct_gen"], result["bench_cpu_pct_gen"] = cpu.mean(first, last)
        cores = psutil.cpu_count() or 1
        rows = sum(int(s["rows"]) for s in spans.values())
        result.update(
            gen_wall_s=round(last - first, 2),
            # What this bench's processes burnt per row generated, all of them together.
            cpu_core_s_per_row=round(
                (result["bench_cpu_pct_gen"] or 0.0) / 100 * cores * (last - first) / rows,
                4,
            ),
            rows_per_s=round(rows / (last - first), 2),
            # Seconds from the dataset's first shard start: a late node shows as a late start.
            per_node={
                name: {
                    "shards": int(s["shards"]),
                    "rows": int(s["rows"]),
                    "start_offset_s": round(s["start"] - first, 2),
                    "end_offset_s": round(s["end"] - first, 2),
                    "rows_per_s": round(s["rows"] / max(s["end"] - s["start"], 1e-9), 2),
                }
                for name, s in sorted(spans.items())
            },
            run_start_to_first_shard_s=round(first - started_at, 2),
        )
    return result


@contextmanager
def _cluster(root: Path, max_nodes: int) -> Iterator[tuple[MotoS3, Server]]:
    """Moto S3, a Prefect server with the deployments, and a worker per pool, all online."""
    with (
        moto_server() as s3,
        prefect_server(root / "prefect-home", startup_timeout=240) as server,
        ExitStack() as workers,
    ):
        _create_pools(server, max_nodes)
        _deploy(server, root, max_nodes)
        pools = ["regen-cpu", *(_node_pool(i) for i in range(1, max_nodes + 1))]
        for pool in pools:
            log = root / f"worker-{pool}.log"
            workers.enter_context(prefect_worker(server, pool, root, log, s3.env))
        _wait_workers_online(server, pools)
        yield s3, server


def _worker_logs(root: Path) -> Iterator[tuple[str, str]]:
    for log in sorted(root.glob("worker-*.log")):
        yield log.name, log.read_text()[-4000:]


def _table(cases: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    columns = ["nodes", "state", "shards per node", "node starts s", "gen wall s", "speedup"]
    columns += ["efficiency", "CPU bound", "rate speedup", "e2e wall s", "e2e speedup"]
    columns += ["CPU % gen (bench)", "CPU % e2e (bench)"]
    for name in columns:
        table.add_column(name, justify="right")
    for c in cases:
        per_node = c.get("per_node", {}).values()
        table.add_row(
            str(c["nodes"]),
            c["parent_state"],
            " / ".join(str(n["shards"]) for n in per_node) or "-",
            " / ".join(f"{n['start_offset_s']:.0f}" for n in per_node) or "-",
            _fmt(c.get("gen_wall_s")),
            _fmt(c.get("speedup"), "x"),
            _fmt(c.get("efficiency")),
            _fmt(c.get("cpu_bound_speedup"), "x"),
            _fmt(c.get("rate_speedup"), "x"),
            _fmt(c["e2e_wall_s"]),
            _fmt(c.get("e2e_speedup"), "x"),
            f"{_fmt(c.get('cpu_pct_gen'), '', 0)} ({_fmt(c.get('bench_cpu_pct_gen'), '', 0)})",
            f"{_fmt(c['cpu_pct_e2e'], '', 0)} ({_fmt(c['bench_cpu_pct_e2e'], '', 0)})",
        )
    return table


def _fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _add_speedups(cases: list[dict[str, Any]], idle_bench_pct: float | None) -> float | None:
    """Over the one-node case, where both completed: wall speedup and efficiency, and the
    rate speedup (each node's rows/s over its own span, summed), which leaves out how much
    later than the first node the others started generating.

    Returns the speedup the machine's cores allow at most: all CPU not spent idling (server,
    idle workers) over what one node's generation added to that, so the work per row assumed
    the same however many nodes share it. Each case's `cpu_bound_speedup` is that or N.
    """
    base = next((c for c in cases if c["nodes"] == 1 and c.get("gen_wall_s")), None)
    if base is None:
        return None
    ceiling = None
    if idle_bench_pct is not None and base["bench_cpu_pct_gen"] is not None:
        one_node = base["bench_cpu_pct_gen"] - idle_bench_pct
        ceiling = round((100.0 - idle_bench_pct) / one_node, 3) if one_node > 0 else None
    for c in cases:
        if c["parent_state"] == "Completed" and c.get("gen_wall_s"):
            c["speedup"] = round(base["gen_wall_s"] / c["gen_wall_s"], 3)
            c["efficiency"] = round(c["speedup"] / c["nodes"], 3)
            rates = sum(n["rows_per_s"] for n in c["per_node"].values())
            c["rate_speedup"] = round(rates / base["rows_per_s"], 3)
            c["e2e_speedup"] = round(base["e2e_wall_s"] / c["e2e_wall_s"], 3)
            if ceiling is not None:
                c["cpu_bound_speedup"] = round(min(float(c["nodes"]), ceiling), 3)
                c["efficiency_vs_cpu_bound"] = round(c["speedup"] / c["cpu_bound_speedup"], 3)
    return ceiling


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1200)
    parser.add_argument("--shard-size", type=int, default=10)
    parser.add_argument("--nodes", default="1,2,4", help="Comma-separated node counts.")
    parser.add_argument(
        "--time-scale", type=float, default=0.25, help="Emulator wall s per simulated s."
    )
    parser.add_argument("--tokens-per-s", type=float, default=100.0)
    parser.add_argument("--reasoning-tokens", default="30:60")
    parser.add_argument("--answer-tokens", default="40:80")
    parser.add_argument("--concurrency", type=int, default=4, help="Slots per node's server.")
    parser.add_argument("--lease-s", type=float, default=30.0)
    parser.add_argument("--case-timeout", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true", help="Keep the run directories.")
    parser.add_argument("--smoke", action="store_true", help="40 prompts on 2 nodes")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.nodes, args.time_scale, args.case_timeout = 40, "2", 0.05, 300.0
    counts = sorted({int(n) for n in args.nodes.split(",")})
    # Stopped with SIGTERM, the bench still stops its workers, server and emulators.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    console = Console(width=160)
    root = Path(tempfile.mkdtemp(prefix="regen-multinode-"))
    cases: list[dict[str, Any]] = []
    try:
        prompts = write_prompts(root / "prompts.jsonl", args.prompts)
        with _cluster(root, max(counts)) as (s3, server):
            with CpuSampler() as idle:
                time.sleep(5)
            idle_cpu, idle_bench = idle.mean(0, time.time())
            console.print(
                f"idle cluster (server + {max(counts) + 1} workers): machine {idle_cpu} % CPU, "
                f"of which this bench {idle_bench} %"
            )
            for nodes in counts:
                case = _case(s3, server, root, prompts, nodes, args)
                cases.append(case)
                console.print(case)
                if case["parent_state"] != "Completed":
                    for name, text in _worker_logs(root):
                        console.print(f"--- {name}:\n{text}")
    finally:
        for work_dir in root.glob("nodes-*/node-*"):
            reap_orphans(work_dir)
        if args.keep:
            console.print(f"run directories kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    ceiling = _add_speedups(cases, idle_bench)
    title = (
        f"multinode: {args.prompts} prompts, shard {args.shard_size}, 1 emulator x "
        f"{args.concurrency} slots per node, time_scale {args.time_scale}"
    )
    console.print(_table(cases, title))
    by_nodes = {c["nodes"]: c for c in cases}
    cores = psutil.cpu_count(logical=True) or 0
    result: dict[str, Any] = {
        **{f"speedup_{n}": by_nodes[n].get("speedup") for n in counts if n != 1},
        **{f"efficiency_{n}": by_nodes[n].get("efficiency") for n in counts if n != 1},
        **{f"rate_speedup_{n}": by_nodes[n].get("rate_speedup") for n in counts if n != 1},
        **{
            f"efficiency_vs_cpu_bound_{n}": by_nodes[n].get("efficiency_vs_cpu_bound")
            for n in counts
            if n != 1
        },
        **{f"e2e_speedup_{n}": by_nodes[n].get("e2e_speedup") for n in counts if n != 1},
        "gen_wall_s": {str(c["nodes"]): c.get("gen_wall_s") for c in cases},
        "e2e_wall_s": {str(c["nodes"]): c["e2e_wall_s"] for c in cases},
        "machine": {
            "logical_cores": cores,
            "physical_cores": psutil.cpu_count(logical=False),
            "idle_cpu_pct": idle_cpu,
            "idle_bench_cpu_pct": idle_bench,
            "cpu_bound_speedup": ceiling,
            "note": (
                f"every node's flow process, worker and emulator, the parent, the Prefect "
                f"server and moto S3 share these {cores} cores; a real node brings its own"
            ),
        },
        "load": {
            "prompts": args.prompts,
            "shard_size": args.shard_size,
            "servers_per_node": 1,
            "concurrency_per_server": args.concurrency,
            "time_scale": args.time_scale,
            "tokens_per_s": args.tokens_per_s,
            "reasoning_tokens": args.reasoning_tokens,
            "answer_tokens": args.answer_tokens,
            "lease_s": args.lease_s,
            "storage": "moto S3 (loopback)",
        },
        "smoke": args.smoke,
        "cases": cases,
    }
    results_path("multinode", smoke=args.smoke).write_text(json.dumps(result, indent=2) + "\n")
    console.print({k: v for k, v in result.items() if k not in ("cases", "load")})
    return 0 if all(c["parent_state"] == "Completed" for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
