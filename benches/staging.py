"""Staging throughput: a synthetic multi-shard model from a directory (vs `cp -r` on the same
disk) and from a moto S3 server, plus the time of the idempotent second staging.

    python benches/staging.py [--local-mb 2000] [--s3-mb 512] [--files 4] [--dir /tmp] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.machine.ports import quiet_port_range
from regen.staging import stage_model
from regen.storage.s3 import client_config

_BLOCK = 16 << 20


def write_model(root: Path, total_mb: int, files: int) -> None:
    """Shards of incompressible bytes: one random block, each copy stamped so none repeat."""
    root.mkdir(parents=True)
    for name, data in {
        "config.json": b"{}",
        "tokenizer.json": b"{}",
        "tokenizer_config.json": b"{}",
    }.items():
        (root / name).write_bytes(data)
    block = bytearray(os.urandom(_BLOCK))
    per_file = total_mb * (1 << 20) // files
    for i in range(files):
        with (root / f"model-{i + 1:05d}-of-{files:05d}.safetensors").open("wb") as fh:
            for n in range(per_file // _BLOCK):
                block[:16] = f"{i:08d}{n:08d}".encode()
                fh.write(block)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def best_of_alternating(
    runs: int, contenders: list[Callable[[], object]], cleanup: Callable[[], None]
) -> list[float]:
    """Each contender's fastest run, taken in turns so write-back of one run's dirty pages
    slows both alike; the machine is shared, the best run is the least disturbed one."""
    times: list[list[float]] = [[] for _ in contenders]
    for _ in range(runs):
        for i, fn in enumerate(contenders):
            cleanup()
            times[i].append(timed(fn))
    return [min(t) for t in times]


@contextmanager
def moto_process() -> Iterator[str]:
    """moto in its own process, so the server does not share our GIL with the downloads."""
    port = quiet_port_range(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bench_local(work: Path, mb: int, files: int, runs: int) -> dict[str, float]:
    source, target = work / "model", work / "staged"
    write_model(source, mb, files)
    total = sum(p.stat().st_size for p in source.iterdir())

    def clean() -> None:
        shutil.rmtree(target, ignore_errors=True)

    # Read once so both contenders start from the same page cache.
    subprocess.run(["cat", *map(str, source.iterdir())], stdout=subprocess.DEVNULL, check=True)
    cp_s, stage_s = best_of_alternating(
        runs,
        [
            lambda: subprocess.run(["cp", "-r", source, target], check=True),
            lambda: stage_model(str(source), target),
        ],
        clean,
    )
    restage_s = timed(lambda: stage_model(str(source), target))
    clean()
    shutil.rmtree(source)
    return {
        "bytes": total,
        "cp_s": cp_s,
        "stage_s": stage_s,
        "restage_s": restage_s,
        "local_vs_cp_ratio": cp_s / stage_s,
    }


def bench_s3(work: Path, mb: int, files: int) -> dict[str, float]:
    source, target = work / "s3-model", work / "s3-staged"
    write_model(source, mb, files)
    total = sum(p.stat().st_size for p in source.iterdir())
    with moto_process() as endpoint:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            config=client_config(),
        )
        client.create_bucket(Bucket="regen-bench")
        # Uploaded in 64 MB parts like a real checkpoint, so the ETags are multipart ones.
        upload = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20)
        for path in source.iterdir():
            client.upload_file(str(path), "regen-bench", f"m/{path.name}", Config=upload)
        shutil.rmtree(source)
        result = stage_model("s3://regen-bench/m", target, s3_client_factory=lambda: client)
        restage_s = timed(
            lambda: stage_model("s3://regen-bench/m", target, s3_client_factory=lambda: client)
        )
    shutil.rmtree(target)
    return {
        "bytes": total,
        "stage_s": result.seconds,
        "s3_mb_per_s": total / result.seconds / 1e6,
        "restage_s": restage_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local-mb", type=int, default=2000)
    parser.add_argument("--s3-mb", type=int, default=512)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--smoke", action="store_true", help="8 MB local, 8 MB S3, one run")
    args = parser.parse_args()
    if args.smoke:
        args.local_mb, args.s3_mb, args.runs = 8, 8, 1

    with tempfile.TemporaryDirectory(prefix="regen-bench-staging-", dir=args.dir) as tmp:
        local = bench_local(Path(tmp), args.local_mb, args.files, args.runs)
        s3 = bench_s3(Path(tmp), args.s3_mb, args.files)

    table = Table(title="model staging")
    for column in ("case", "size MB", "cp -r s", "stage s", "MB/s", "vs cp", "restage s"):
        table.add_column(column, justify="right")
    table.add_row(
        "local dir",
        f"{local['bytes'] / 1e6:.0f}",
        f"{local['cp_s']:.2f}",
        f"{local['stage_s']:.2f}",
        f"{local['bytes'] / local['stage_s'] / 1e6:.0f}",
        f"{local['local_vs_cp_ratio']:.2f}x",
        f"{local['restage_s']:.3f}",
    )
    table.add_row(
        "moto S3",
        f"{s3['bytes'] / 1e6:.0f}",
        "-",
        f"{s3['stage_s']:.2f}",
        f"{s3['s3_mb_per_s']:.0f}",
        "-",
        f"{s3['restage_s']:.3f}",
    )
    Console().print(table)
    summary = {
        "local_vs_cp_ratio": round(local["local_vs_cp_ratio"], 3),
        "s3_mb_per_s": round(s3["s3_mb_per_s"], 1),
        "restage_s": round(max(local["restage_s"], s3["restage_s"]), 4),
        "local": local,
        "s3": s3,
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    results_path("staging", smoke=args.smoke).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
