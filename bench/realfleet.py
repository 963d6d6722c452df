"""The real parts several benches start on loopback: a real agent and a real gateway as
processes on one fleet file, with the bench's tokens, and their orderly stop.

Used by bench.diagnose_quiet, bench.incident_drill and bench.rollout_run (each writes its
own fleet file: what it measures differs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.engines import servers

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-operator"  # the node's operator token (its token_env: BENCH_NODE_TOKEN)
ADMIN = "bench-admin-0123456789"  # the gateway's admin token
HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def bench_env() -> dict[str, str]:
    """The tokens in this process's environment (the console and the CLI read them) and
    the environment for the agent, gateway and CLI processes."""
    os.environ.update(BENCH_NODE_TOKEN=TOKEN, ENGINEROOM_ADMIN_TOKEN=ADMIN)
    return {
        **os.environ,
        "ENGINEROOM_OPERATOR_TOKEN": f"bench:{TOKEN}",
        "ENGINEROOM_VIEWER_TOKEN": "bench-viewer",
        "ENGINEROOM_GATEWAY_VIEWER_TOKEN": "bench-gw-viewer-0123456789",
    }


def start_agent_and_gateway(
    work: Path, fleet: Path, agent_port: int, gw_port: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    """`engineroom agent` for node "local" and `engineroom gateway`, logging to work/,
    both answering /healthz (60 s each) before this returns."""
    procs = []
    for name, argv in (
        ("agent", ["agent", "--fleet", str(fleet), "--node", "local", "--listen",
                   f"127.0.0.1:{agent_port}"]),
        ("gateway", ["gateway", "--fleet", str(fleet)]),
    ):  # fmt: skip
        with (work / f"{name}.log").open("wb") as log:
            procs.append(
                subprocess.Popen([sys.executable, "-m", "console.cli", *argv], stdout=log,
                                 stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            )  # fmt: skip
    try:
        for url in (f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{gw_port}"):
            servers.wait_until(
                lambda u=url: servers._http_get(u + "/healthz") is not None, 60, what=url
            )
    except BaseException:
        stop_all(procs)
        raise
    return procs


def stop_all(procs: list[subprocess.Popen[bytes]], grace: float = 30) -> None:
    """SIGTERM each, then wait up to `grace` s for each."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
