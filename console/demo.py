"""`engineroom demo`: the console on a SIMULATED local fleet.

The simulated fleet runs in a child process (`python -m console.sim`): real agents, real
plugins and real HTTP on loopback, over simulated GPUs and engines. The console here is
the same one that watches a real fleet. With --no-tui the fleet just runs, for scripts
and benchmarks, and the first line printed is "fleet: PATH"; a generated token is
printed to stderr as an `export` line, for a second console.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from console.sim.fleetfile import TOKEN_ENV, VIEWER_TOKEN_ENV, viewer_token_for


def start_sim(nodes: int, out_dir: Path, token: str) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, TOKEN_ENV: token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "console.sim", "--nodes", str(nodes), "--out", str(out_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if not first.startswith("fleet: "):
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"the simulated fleet did not start: {first!r} {err[-2000:]}")
    return proc, Path(first.removeprefix("fleet: ").strip())


def run_demo(*, no_tui: bool = False, nodes: int = 4) -> int:
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        token = secrets.token_urlsafe(24)
    if no_tui:  # a second console needs them; the built-in one reads them from here
        print(
            f"engineroom demo: the tokens of this run:\n"
            f"  export {TOKEN_ENV}={token}\n"
            f"  export {VIEWER_TOKEN_ENV}={viewer_token_for(token)}\n"
            "  then, in another terminal: engineroom --fleet PATH (the 'fleet: PATH' line),\n"
            "  or the read-only web view: engineroom serve --web --fleet PATH",
            file=sys.stderr,
            flush=True,
        )
    os.environ[TOKEN_ENV] = token  # the console reads the agents' token from here
    os.environ[VIEWER_TOKEN_ENV] = viewer_token_for(token)  # and a web view its viewer token
    if no_tui:
        from console.sim.__main__ import main

        return main(["--nodes", str(nodes)])
    out_dir = Path(tempfile.mkdtemp(prefix="engineroom-demo-"))
    proc, fleet_path = start_sim(nodes, out_dir, token)

    def stop_sim() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(out_dir, ignore_errors=True)  # the fleet file, agents' state, logs

    try:
        from console.core.config.load import load_fleet
        from console.tui.app import run_tui

        return run_tui(load_fleet(fleet_path), cleanup=stop_sim)
    finally:
        stop_sim()
