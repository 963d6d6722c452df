"""The scale fleet: many lightweight SIMULATED agents in one process, for the console bench."""

from __future__ import annotations

import asyncio

import httpx

from console.core.config.load import load_fleet
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


def _stream_times(agent: str, lines: int) -> list[float]:
    """The agent's time on each of the next `lines` snapshots of its stream."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    times: list[float] = []
    with httpx.stream("GET", f"{agent}/v1/snapshot/stream", headers=headers, timeout=10) as r:
        for line in r.iter_lines():
            times.append(Snapshot.model_validate_json(line).node.time)
            if len(times) == lines:
                return times
    raise AssertionError(f"the stream of {agent} ended after {len(times)} snapshots")


def test_every_simulated_node_gets_a_new_snapshot_every_refresh(tmp_path):
    """The bench's "1,000 nodes refreshing every second" holds: the rebuild keeps to its
    schedule however long rebuilding a slice of the fleet takes (it used to sleep a whole
    step after each slice's work, and every node's round came 10-25 % late)."""
    sim = start_sim(tmp_path, "--scale", "300", "--refresh", "0.2")
    try:
        fleet = load_fleet(sim.fleet)
        agent = fleet.nodes[7].agent
        assert agent is not None
        times = _stream_times(agent, 1 + 25)[1:]  # the first line is the current snapshot
        mean = (times[-1] - times[0]) / (len(times) - 1)
        assert 0.19 <= mean <= 0.206, f"a new snapshot every {mean:.3f} s, not every 0.2 s"
        who = sim.get(f"{agent}/v1/whoami").json()
        assert who["role"] == "operator"
        assert sim.get(f"{agent}/v1/whoami", token="wrong-token-000").status_code == 401
    finally:
        assert end(sim) == 0
