"""The scale fleet: many lightweight SIMULATED agents in one process, for the console bench."""

from __future__ import annotations

import asyncio

import httpx

from console.core.config import load_fleet
from console.core.wire import Snapshot
from tests.engines.servers import wait_until
from tests.sim.conftest import TOKEN, end, start_sim


async def _all_snapshots(agents: list[str]) -> list[httpx.Response]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=10) as client:
        return await asyncio.gather(*(client.get(f"{a}/v1/snapshot") for a in agents))


def test_fifty_simulated_nodes_serve_valid_changing_snapshots(tmp_path):
    sim = start_sim(tmp_path, "--scale", "50", "--refresh", "0.5")
    try:
        fleet = load_fleet(sim.fleet)
        assert "SIMULATED" in fleet.fleet.name
        assert len(fleet.nodes) == 50
        assert sum(len(m.deployments) for m in fleet.models) == 100
        agents = [n.agent for n in fleet.nodes if n.agent]
        first = asyncio.run(_all_snapshots(agents))
        snaps = [Snapshot.model_validate_json(r.content) for r in first]
        assert [s.node.name for s in snaps] == [n.name for n in fleet.nodes]
        for snap in snaps:
            assert len(snap.gpus) == 8 and len(snap.engines) == 2
            assert all(g.name == "NVIDIA H200 (SIMULATED)" for g in snap.gpus)
            assert all(e.models and e.models[0].request_rate for e in snap.engines)
        assert max(len(r.content) for r in first) < 8000  # cheap to serve and to parse

        def rebuilt() -> Snapshot | None:
            snap = Snapshot.model_validate_json(sim.get(f"{agents[0]}/v1/snapshot").content)
            return snap if snap.node.time > snaps[0].node.time else None

        wait_until(rebuilt, timeout=5, what="a snapshot rebuilt with new values")
        assert sim.get(f"{agents[0]}/v1/snapshot", token=None).status_code == 401
        assert sim.get(f"{agents[0]}/healthz", token=None).json()["status"] == "ok"
    finally:
        assert end(sim) == 0
