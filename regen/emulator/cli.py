"""The emulator's entry point (`python -m regen.emulator`, `regen emulator`): one server.

Startup follows SGLang's order: load (the port stays closed), open the port, one warm-up
generation, then `The server is fired up and ready to roll!`. Logs go to stdout.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
from pathlib import Path

from aiohttp import web

from regen.emulator.args import EmuArgs, parse_args
from regen.emulator.routes import EmulatorServer

log = logging.getLogger("regen.emulator")
READY_LINE = "The server is fired up and ready to roll!"
_HF_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def main(argv: list[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 1 on a startup failure, 2 on bad flags."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
        force=True,
    )
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 0


async def serve(args: EmuArgs) -> int:
    """The whole server lifetime; returns the process exit code."""
    # As 0.5.23's engine.py logs them: every resolved argument, api_key in clear. The fleet
    # keeps server logs 0600 under work_dir/logs and never copies them anywhere else.
    log.info("server_args=%s", args.server_args)
    if args.server_args.get("disable_cuda_graph"):
        log.warning("--disable-cuda-graph is deprecated.")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("Load weight begin. avail mem=emulated")
    load_s = args.load_s * args.time_scale
    if args.faults.no_ready:
        log.info("Loading is taking longer than expected (emulated fault no-ready).")
        await stop.wait()
        return 0
    if args.faults.fail_startup:
        await asyncio.sleep(load_s / 2)
        log.error("RuntimeError: emulated fault fail-startup: the model failed to load.")
        return 1
    await asyncio.sleep(load_s)
    path = Path(args.model_path).expanduser()
    if not path.exists() and not _HF_REPO_ID.match(args.model_path):
        log.error("OSError: model path %s does not exist and is not a Hub repo id.", path)
        return 1
    log.info("Load weight end. type=emulated")
    server = EmulatorServer(args)
    runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        # A deep backlog: hundreds of clients connect in the same millisecond.
        await web.TCPSite(runner, args.host, args.port, backlog=4096).start()
    except OSError as err:
        log.error("Could not bind %s:%d: %s", args.host, args.port, err)
        await runner.cleanup()
        return 1
    log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", args.host, args.port)
    if not args.skip_server_warmup:
        await asyncio.sleep(server.scheduler.wall_per_token)  # the one-token warm-up generation
    server.ready = True
    log.info(READY_LINE)
    reporter = asyncio.create_task(server.scheduler.report_loop())
    await stop.wait()
    log.info("Shutting down. Served %d requests.", server.counters.requests)
    reporter.cancel()
    server.scheduler.close()
    await runner.cleanup()
    return 0
