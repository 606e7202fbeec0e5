"""The features' path from the server to regen: stock SGLang's JSON against regen's capture
module, in CPU seconds per million feature values, and what that means for an 8B target.

One server at a time on this CPU (the real SGLang 0.5.23 over an 8-layer tiny Qwen3, or with
`--engine emulator` regen's emulator), the same prefill requests (`--requests` samples of
`--tokens` token ids, one at a time) three ways:

- baseline: `return_hidden_states` false: the prefill alone, whose server CPU is subtracted;
- stock: a server without regen's module answers with JSON rows, a Python float per value
  (srt/managers/scheduler_components/batch_result_processor.py:659 `.tolist()`), decoded
  with orjson and made a numpy array as regen would;
- capture: a server with regen's capture module (regen/features/sglang_site) writes each
  request's tensors to a safetensors file on /dev/shm; regen reads, checks and deletes it.

Server CPU is the server's whole process tree (HTTP, scheduler, detokenizer) over the
baseline's; client CPU is this process's. The projection divides one core's values per CPU
second (stock's cost sits in the scheduler's one thread and the tokenizer manager's, in
series with the GPU's loop) by an 8B target's values per sample (hidden 4096, 3 aux layers
+ the final state, 2,000 tokens), beside `--gpu-prefill-tok-s` (an assumption, not measured
here: there is no GPU).

    .venv/bin/python benches/features.py [--smoke] [--engine sglang|emulator]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.features.capture import CAPTURE_ENV, parse_json, read_keyed, request_body
from regen.features.site import SITE_DIR
from regen.fleet.commands import CPU_ENV, CPU_FLAGS
from regen.machine.ports import quiet_port_range
from support.engine import SGLANG_PYTHON, env_ready
from support.tiny_model import build as build_tiny_model

EIGHT_B = {"hidden": 4096, "aux_layers": 3, "tokens": 2000}


def _server(engine: str, model: Path, port: int, capture_dir: Path | None, log: Path) -> Any:
    capture = ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3"]
    common = ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(port)]
    common += [*capture, "--disable-radix-cache", "--context-length", "4096"]
    env = {**os.environ}
    if engine == "sglang":
        argv = [str(SGLANG_PYTHON), "-m", "sglang.launch_server", *common, *CPU_FLAGS]
        argv += ["--max-total-tokens", "16384", "--max-running-requests", "4"]
        env.update(CPU_ENV)
    else:
        argv = [sys.executable, "-m", "regen.emulator", *common, "--emu-time-scale", "0.001"]
    if capture_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), env.get("PYTHONPATH")]))
        env[CAPTURE_ENV] = str(capture_dir)
    out = log.open("w")
    process = subprocess.Popen(
        argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited {process.returncode}; see {log}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return process
        except OSError:
            pass
        time.sleep(1)
    _stop(process)
    raise SystemExit(f"the server did not come up in 300 s; see {log}")


def _stop(process: Any) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)


def _tree_cpu(pid: int) -> float:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def _run(
    port: int, pid: int, samples: list[list[int]], mode: str, capture_dir: Path | None
) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    values = wire = 0
    server0, client0, wall0 = _tree_cpu(pid), time.process_time(), time.perf_counter()
    for i, ids in enumerate(samples):
        body = request_body(ids, f"bench-{mode}-{i}-{time.time_ns()}")
        body["return_hidden_states"] = mode != "baseline"
        conn.request("POST", "/generate", orjson.dumps(body), {"content-type": "application/json"})
        raw = conn.getresponse().read()
        wire += len(raw)
        answer = orjson.loads(raw)
        if mode == "stock":
            values += parse_json(answer, len(ids)).values
        elif mode == "capture":
            assert capture_dir is not None
            values += read_keyed(answer, ids, capture_dir).values
    return {
        "mode": mode,
        "requests": len(samples),
        "tokens": sum(map(len, samples)),
        "values": values,
        "server_cpu_s": _tree_cpu(pid) - server0,
        "client_cpu_s": time.process_time() - client0,
        "wall_s": time.perf_counter() - wall0,
        "response_bytes": wire,
    }


def _measure(
    engine: str, model: Path, sizes: list[list[list[int]]], work: Path, capture: bool
) -> dict[str, Any]:
    """Each size's baseline and path runs on one server, and the path's cost split into a
    part per request and a part per value (the line through the two sizes)."""
    port = quiet_port_range(1)
    name = "capture" if capture else "stock"
    capture_dir = work / "capture" if capture else None
    process = _server(engine, model, port, capture_dir, work / f"server-{name}.log")
    runs = []
    try:
        _run(port, process.pid, sizes[0][:2], "baseline", None)  # warm-up
        for samples in sizes:
            base = _run(port, process.pid, samples, "baseline", None)
            path = _run(port, process.pid, samples, name, capture_dir)
            overhead = max(path["server_cpu_s"] - base["server_cpu_s"], 0.0)
            cpu = overhead + path["client_cpu_s"]
            path.update(
                baseline=base,
                server_overhead_cpu_s=overhead,
                cpu_s=cpu,
                cpu_s_per_m_values=cpu / path["values"] * 1e6 if path["values"] else None,
                values_per_cpu_s=path["values"] / cpu if cpu else None,
            )
            runs.append(path)
    finally:
        _stop(process)
    short, long = runs[0], runs[-1]
    per_value = (long["cpu_s"] - short["cpu_s"]) / max(long["values"] - short["values"], 1)
    per_value = max(per_value, 0.0)
    fixed = short["cpu_s"] - per_value * short["values"]
    return {
        "mode": name,
        "runs": runs,
        "cpu_s_per_value": per_value,
        "cpu_s_per_request": max(fixed / short["requests"], 0.0),
    }


def _projection(path: dict[str, Any], gpu_tok_s: float) -> dict[str, Any]:
    layers = EIGHT_B["aux_layers"] + (1 if path["mode"] == "capture" else 0)
    per_sample = EIGHT_B["tokens"] * layers * EIGHT_B["hidden"]
    cpu = path["cpu_s_per_request"] + path["cpu_s_per_value"] * per_sample
    ceiling = 1 / cpu if cpu else float("inf")
    gpu = gpu_tok_s / EIGHT_B["tokens"]
    return {
        "mode": path["mode"],
        "values_per_sample": per_sample,
        "cpu_s_per_sample": cpu,
        "samples_per_s_one_core": ceiling,
        "gpu_samples_per_s_assumed": gpu,
        "holds_gpu_rate": ceiling >= gpu,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--smoke", action="store_true", help="the emulator, 3 short samples (seconds)")
    p.add_argument(
        "--engine",
        choices=["sglang", "emulator"],
        help="default: sglang when .venv-sglang serves, else the emulator (smoke: the emulator)",
    )
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--tokens", type=int, default=1500)
    p.add_argument(
        "--gpu-prefill-tok-s",
        type=float,
        default=20000.0,
        help="an 8B target's prefill rate on one GPU (assumed)",
    )
    a = p.parse_args()
    engine = a.engine or ("emulator" if a.smoke or not env_ready() else "sglang")
    requests, tokens = (3, 64) if a.smoke else (a.requests, a.tokens)
    work = Path(tempfile.mkdtemp(prefix="regen-bench-features-"))
    try:
        if engine == "sglang":
            model = build_tiny_model(work / "tiny8", layers=8)
            vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        else:
            model = Path(__file__).resolve().parents[1] / "regen" / "data" / "emulator-model"
            vocab = 100

        def batch(n: int, length: int) -> list[list[int]]:
            return [[(i * 31 + k * 7) % (vocab - 1) + 1 for k in range(length)] for i in range(n)]

        sizes = [batch(requests, max(tokens // 4, 8)), batch(requests, tokens)]
        stock = _measure(engine, model, sizes, work, capture=False)
        ours = _measure(engine, model, sizes, work, capture=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    projections = [_projection(path, a.gpu_prefill_tok_s) for path in (stock, ours)]
    print(f"engine: {engine}; {requests} samples of {max(tokens // 4, 8)} and {tokens} tokens")
    head = ("path", "tokens", "values", "server CPU s", "client CPU s", "CPU s/M values")
    print("{:8} {:>7} {:>11} {:>12} {:>12} {:>15} {:>14}".format(*head, "values/CPU s"))
    for path in (stock, ours):
        for r in path["runs"]:
            cells = [r["mode"], f"{r['tokens'] // r['requests']}", f"{r['values']:,}"]
            cells += [f"{r['server_overhead_cpu_s']:.3f}", f"{r['client_cpu_s']:.3f}"]
            cells += [f"{r['cpu_s_per_m_values'] or 0:.3f}", f"{r['values_per_cpu_s'] or 0:,.0f}"]
            print("{:8} {:>7} {:>11} {:>12} {:>12} {:>15} {:>14}".format(*cells))
    print(
        f"8B target (hidden {EIGHT_B['hidden']}, {EIGHT_B['tokens']:,} tokens a sample), "
        f"one core of each path, against {a.gpu_prefill_tok_s:,.0f} prefill tok/s a GPU "
        "(assumed):"
    )
    for pr in projections:
        verdict = "holds" if pr["holds_gpu_rate"] else "below"
        print(
            f"  {pr['mode']:8} {pr['values_per_sample']:,} values a sample, "
            f"{pr['cpu_s_per_sample']:.3f} CPU s: {pr['samples_per_s_one_core']:.2f} samples/s "
            f"({verdict} the GPU's {pr['gpu_samples_per_s_assumed']:.1f})"
        )
    result = {
        "smoke": a.smoke,
        "setup": {
            "engine": engine,
            "requests": requests,
            "tokens": tokens,
            "smoke": a.smoke,
            "gpu_prefill_tok_s": a.gpu_prefill_tok_s,
        },
        "stock": stock,
        "capture": ours,
        "projection_8b": projections,
    }
    results_path("features", smoke=a.smoke).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
