"""SSH refresh against agent refresh for the same node, and SSH nodes per 5 s.

    make bench        (or: .venv/bin/python -m bench.ssh_refresh)

A real OpenSSH server on loopback (tests/sshd.py) and a real agent, both on this machine.

1. One node, three ways, each refreshed REFRESHES times, medians, in one run:
   - agent: GET /v1/snapshot from the running agent (what the collector does);
   - ssh: `engineroom agent --once --json` over a kept SSH connection;
   - ssh fallback: the nvidia-smi path (nvidia-smi TEST DOUBLE: no GPU here).
   Wall time per refresh, and the console's own CPU per refresh.
2. Capacity: N SSH nodes refreshed as one round (connections kept, `ssh_concurrency`
   16). The remote command is `cat` of a recorded snapshot, so the round measures the
   console's side and sshd, not the host's work (which on a real fleet runs on N other
   machines); on this 2-core machine sshd's own work is included.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.collect.sources.collector import Collector  # noqa: E402
from console.core.config.load import parse_fleet  # noqa: E402
from tests.engines import servers  # noqa: E402
from tests.sshd import (  # noqa: E402
    install_engineroom,
    install_nvidia_smi_double,
    start_sshd,
    stop_sshd,
)

REFRESHES = 15
SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshot-cpu-vllm-triton.json"


def ssh_node(sshd, name: str, known: Path, command: list[str] | None = None) -> str:  # type: ignore[no-untyped-def]
    extra = f"ssh_agent_command = {command!r}\n".replace("'", '"') if command else ""
    return (
        f'[[nodes]]\nname = "{name}"\nssh = "{sshd.user}@127.0.0.1"\nssh_port = {sshd.port}\n'
        f'ssh_key = "{sshd.client_key}"\nssh_known_hosts = "{known}"\n{extra}'
    )


async def refreshes(text: str, n: int) -> tuple[float, float]:
    """(median wall ms, median console CPU ms) of `n` rounds of poll_all."""
    walls, cpus = [], []
    async with Collector(parse_fleet(text)) as collector:
        await collector.poll_all()  # connect once: refreshes reuse the connection
        for _ in range(n):
            w, c = time.perf_counter(), time.process_time()
            states = await collector.poll_all()
            walls.append((time.perf_counter() - w) * 1000)
            cpus.append((time.process_time() - c) * 1000)
            bad = [s.error for s in states.values() if s.error]
            if bad:
                raise RuntimeError(bad[0])
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="engineroom-ssh-bench-"))
    sshd = start_sshd(work / "sshd")
    install_engineroom(sshd)
    install_nvidia_smi_double(sshd)
    known = sshd.known_hosts(work / "known_hosts")
    port = servers.free_port()
    fleet = work / "fleet.toml"
    fleet.write_text(
        f'[fleet]\nname = "bench"\n[agent]\nscrape_interval_s = 1\n'
        f'[[nodes]]\nname = "local"\nagent = "http://127.0.0.1:{port}"\ntoken_env = "T"\n'
    )
    env = {**os.environ, "ENGINEROOM_VIEWER_TOKEN": "bench-viewer-token", "T": ""}
    agent = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "agent", "--fleet", str(fleet), "--node", "local",
         "--listen", f"127.0.0.1:{port}"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    os.environ["T"] = "bench-viewer-token"
    try:
        servers.wait_until(
            lambda: servers._http_get(f"http://127.0.0.1:{port}/healthz") is not None, 30
        )
        head = '[fleet]\nname = "b"\nssh_timeout_s = 30\nssh_concurrency = 16\n'
        ways = {
            "agent (HTTP GET /v1/snapshot)": head
            + f'[[nodes]]\nname = "n"\nagent = "http://127.0.0.1:{port}"\ntoken_env = "T"\n',
            "ssh: engineroom agent --once --json": head + ssh_node(sshd, "n", known),
            "ssh: nvidia-smi fallback": head
            + ssh_node(sshd, "n", known, ["engineroom-absent", "agent"]),
        }
        print(f"one node, {REFRESHES} refreshes each, medians:")
        results = {}
        for name, text in ways.items():
            wall, cpu = asyncio.run(refreshes(text, REFRESHES))
            results[name] = (wall, cpu)
            print(f"  {name:<38} {wall:8.1f} ms wall  {cpu:6.2f} ms console CPU", flush=True)
        agent_wall, agent_cpu = results["agent (HTTP GET /v1/snapshot)"]
        ssh_wall, ssh_cpu = results["ssh: engineroom agent --once --json"]
        print(
            f"  ratio ssh/agent: {ssh_wall / agent_wall:.0f}x wall, "
            f"{ssh_cpu / agent_cpu:.1f}x console CPU (the wall is the host starting Python "
            "and sampling)"
        )
        print("\ncapacity: N SSH nodes in one round (remote command: cat a recorded snapshot)")
        for n in (10, 50, 100):
            text = head + "".join(
                ssh_node(sshd, f"n{i}", known, ["cat", str(SNAPSHOT)]) for i in range(n)
            )
            wall, cpu = asyncio.run(refreshes(text, 3))
            per_5s = int(n * 5000 / wall) if wall else 0
            print(
                f"  N={n:<4} round {wall:8.1f} ms wall, {cpu:7.1f} ms console CPU  "
                f"-> about {per_5s} nodes per 5 s at this rate",
                flush=True,
            )
    finally:
        agent.terminate()
        agent.wait(10)
        stop_sshd(sshd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
