"""Fleet startup and teardown: how much time the fleet code adds on top of the servers' load.

Eight emulators with a simulated model load of `--load-s` wall seconds (time scale 1), and
the same fleet with no load at all as a baseline: the baseline is interpreter start plus
probes (at time scale 1 the emulator's /health, like SGLang's, takes about a second), so
the loaded run minus the baseline shows whether the load really overlaps across servers.

    python benches/fleet_startup.py [--servers 8] [--load-s 2] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benches._common import results_path
from regen.config import parse_config
from regen.fleet import build_server_commands, generate_api_key, launch_fleet
from regen.machine.ports import free_port_range, port_is_free
from regen.rehearsal import bundled


def run(servers: int, load_s: float, work_dir: Path) -> dict[str, float]:
    """Launch until every server passed its generation probe, then tear down; wall times."""
    config = parse_config(
        {
            "model": {
                "source": str(bundled("emulator-model")),
                "served_name": "qwen3-emu",
                "stage": False,
            },
            "prompts": "unused.jsonl",
            "output": str(work_dir / "out"),
            "work_dir": str(work_dir),
            "engine": {
                "kind": "emulator",
                "python": sys.executable,
                "gpus": list(range(servers)),
                "base_port": free_port_range(servers, random.randint(20000, 60000)),
                "startup_timeout_s": 120,
                # time_scale 1: the load is `load_s` real seconds, not simulated ones.
                "emulator": {"load_s": load_s, "time_scale": 1.0},
            },
        }
    )
    key = generate_api_key()
    commands = build_server_commands(config, config.model.staged_path(), key, work_dir)
    start = time.monotonic()
    # The fleet as a context: whatever fails before the timed teardown, the servers stop.
    with launch_fleet(config, commands, key) as fleet:
        all_ready = time.monotonic() - start
        startups = [r.startup_s or 0.0 for r in fleet.report]
        start = time.monotonic()
        fleet.teardown()
        teardown = time.monotonic() - start
    assert all(port_is_free(c.host, c.port) for c in commands)
    return {
        "load_s": load_s,
        "all_ready_s": round(all_ready, 3),
        "slowest_server_s": round(max(startups), 3),
        "fastest_server_s": round(min(startups), 3),
        "teardown_s": round(teardown, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=8)
    parser.add_argument("--load-s", type=float, default=2.0)
    parser.add_argument("--smoke", action="store_true", help="2 servers, 0.2 s load")
    args = parser.parse_args()
    if args.smoke:
        args.servers, args.load_s = 2, 0.2
    with tempfile.TemporaryDirectory(prefix="regen-fleet-bench-") as tmp:
        baseline = run(args.servers, 0.0, Path(tmp) / "baseline")
        loaded = run(args.servers, args.load_s, Path(tmp) / "loaded")
    overhead = loaded["all_ready_s"] - loaded["load_s"]
    added = loaded["all_ready_s"] - baseline["all_ready_s"]
    table = Table(title=f"fleet startup, {args.servers} emulators")
    for column in ("run", "load s", "all ready s", "fastest s", "slowest s", "teardown s"):
        table.add_column(column, justify="right")
    for name, r in (("baseline (no load)", baseline), ("loaded", loaded)):
        table.add_row(
            name,
            f"{r['load_s']:.1f}",
            f"{r['all_ready_s']:.2f}",
            f"{r['fastest_server_s']:.2f}",
            f"{r['slowest_server_s']:.2f}",
            f"{r['teardown_s']:.2f}",
        )
    console = Console()
    console.print(table)
    console.print(
        f"all ready - load = {overhead:.2f} s (target <= 1.5 s, includes interpreter start); "
        f"load run - baseline = {added:.2f} s (the load itself: {args.load_s:.1f} s); "
        f"teardown {loaded['teardown_s']:.2f} s (target <= 2 s)"
    )
    result = {
        "servers": args.servers,
        **loaded,
        "overhead_s": round(overhead, 3),
        "baseline_ready_s": baseline["all_ready_s"],
        "baseline_teardown_s": baseline["teardown_s"],
        "smoke": args.smoke,
    }
    results_path("fleet_startup", smoke=args.smoke).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
