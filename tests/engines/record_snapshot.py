"""Record an agent snapshot over real vLLM and Triton with traffic, for the TUI's tests.

    ENGINEROOM_VLLM_PYTHON=... .venv/bin/python -m tests.engines.record_snapshot OUT.json

The TUI's snapshot tests render this recorded, real agent output (and the H200 one in
docs/evidence/) instead of simulated data.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from console.agent.snapshot.node import NodeAgent
from console.core.config.load import parse_fleet
from tests.engines import servers
from tests.engines.triton_repo import write_repo
from tests.support.fleet import LOCAL_AGENT, fleet_model, fleet_toml, triton_ensemble


async def record(vllm: servers.VllmServer, triton: servers.TritonServer) -> str:
    trt = triton_ensemble("tiny-trt", "cpu-1", triton.http_port, triton.metrics_port)
    vllm_dep = {"id": "tiny-vllm", "node": "cpu-1", "engine": "vllm", "endpoint": vllm.base_url}
    fleet = parse_fleet(
        fleet_toml(
            fleet={"name": "recorded"},
            agent={"discover": True, "probe_timeout_s": 5.0},
            nodes=[{"name": "cpu-1", "agent": LOCAL_AGENT}],
            models=[fleet_model("tiny", vllm_dep, trt)],
        )
    )
    agent = NodeAgent(fleet, "cpu-1")
    await agent.cycle()
    await asyncio.to_thread(servers.send_traffic_vllm, vllm.base_url, 8, True)
    await asyncio.to_thread(servers.send_traffic_triton, triton.base_url, "ensemble", 8, True)
    time.sleep(1)
    snap = await agent.cycle()
    await agent.close()
    return snap.model_dump_json(indent=2)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="engineroom-rec-"))
    model = servers.make_tiny_model(work / "model")
    vllm = servers.start_vllm(model, work / "vllm", extra_args=("-O0",))
    triton = servers.start_triton(write_repo(work / "repo"), work / "triton")
    try:
        Path(sys.argv[1]).write_text(asyncio.run(record(vllm, triton)))
    finally:
        servers.stop(vllm)
        servers.stop(triton)


if __name__ == "__main__":
    main()
