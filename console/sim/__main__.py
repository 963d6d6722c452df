"""`python -m console.sim`: run the SIMULATED demo fleet (or, with --scale, the scale fleet).

Prints `fleet: PATH` (the fleet file it wrote) as its first line, then runs until SIGINT or
SIGTERM and stops everything it started. The agents' token comes from ENGINEROOM_DEMO_TOKEN;
without it one is generated and shown on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from console.sim.fleetfile import TOKEN_ENV


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m console.sim", description=__doc__)
    parser.add_argument("--nodes", type=int, default=4, help="demo fleet nodes (default 4)")
    parser.add_argument(
        "--scale", type=int, metavar="N", help="instead: N lightweight simulated agents"
    )
    parser.add_argument("--gpus", type=int, default=8, help="with --scale: GPUs per node")
    parser.add_argument(
        "--refresh", type=float, default=1.0, help="with --scale: seconds between new snapshots"
    )
    parser.add_argument(
        "--window", type=float, default=60.0,
        help="demo: the agents' window for rates and percentiles, s (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--verify", type=float, help="demo: every model's failover check window, s (tests)"
    )
    parser.add_argument("--out", type=Path, help="where to write fleet.toml (default: a temp dir)")
    return parser


async def _serve(args: argparse.Namespace, out_dir: Path, token: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.scale:
        from console.sim.scale import serve_scale_fleet

        running: Any = await serve_scale_fleet(
            out_dir, args.scale, args.gpus, args.refresh, token=token
        )
    else:
        from console.sim.fleet import serve_demo_fleet

        running = await serve_demo_fleet(
            out_dir, args.nodes, token=token, window_s=args.window, verify_s=args.verify
        )
    try:
        print(f"fleet: {running.path}", flush=True)
        await stop.wait()
    finally:
        await running.close()


def _run(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop  # faster loop where installed: less CPU for the same simulation
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.nodes < 1 or (args.scale is not None and args.scale < 1):
        print("console.sim: --nodes and --scale want 1 or more", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        token = secrets.token_urlsafe(24)
        print(
            f"console.sim: {TOKEN_ENV} is not set; this run's token: {token}\n"
            f"  (export {TOKEN_ENV}={token} for a console to connect)",
            file=sys.stderr,
            flush=True,
        )
    elif len(token) < 8:
        print(f"console.sim: {TOKEN_ENV} must be 8 characters or more", file=sys.stderr)
        return 2
    made = args.out is None
    out_dir = Path(tempfile.mkdtemp(prefix="engineroom-sim-")) if made else args.out
    try:
        _run(_serve(args, out_dir, token))
    except KeyboardInterrupt:
        pass
    finally:
        if made:  # the fleet file names ports that are closed now
            shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
