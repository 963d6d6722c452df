"""A rolling restart on the demo fleet, as a newcomer runs it (docs/rollouts.md, "On the
demo fleet"): `engineroom rollout plan --restart --model qwen2.5-32b-instruct`, then
`rollout run --wait`, through the REAL gateway and agents over SIMULATED engines.

The demo's agents start that model's engines from launch profiles (console.sim.fleet), so
they own them and can restart them; before, the rollout halted at its first step: "was
not started by this agent, so there is no launch profile to restart it with" (issue 31).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import httpx
import pytest

from console.core.config.load import load_fleet
from console.sim.demo_layout import LAUNCHED, MODELS
from tests.conftest import run_cli
from tests.engines.servers import wait_until
from tests.sim.conftest import TOKEN, SimFleet, end, start_sim

MODEL = MODELS[LAUNCHED].name
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# What the demo section of docs/rollouts.md tells a newcomer to plan with: the simulated
# engines' p95 over a window of twenty requests moves by a histogram bucket.
TOLERANCE = "2.5"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    # Each step's verify (and its baseline) watches 3 s of traffic, not the default 10 s.
    sim = start_sim(tmp_path_factory.mktemp("demo-rollout"), "--nodes", "2", "--verify", "3")
    yield sim
    end(sim)


def cli(*args: str, timeout: float = 60) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEROOM_")}
    env["ENGINEROOM_DEMO_TOKEN"] = TOKEN
    done = run_cli(*args, env=env, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def engine_pids(demo: SimFleet) -> dict[str, tuple[int | None, str]]:
    """Each deployment of the model: its engine's pid and state, as its agent says."""
    out = {}
    for snap in demo.snapshots().values():
        for engine in snap.engines:
            for dep in engine.deployment_ids:
                out[dep] = (engine.pid, engine.state)
    return out


def gateway_counts(demo: SimFleet) -> dict[str, tuple[int, int]]:
    """Per deployment of the model: (requests finished, requests failed) at the gateway."""
    gateway = load_fleet(demo.fleet).gateway
    assert gateway is not None
    text = demo.get(f"{gateway.url}/metrics").text
    counts: dict[str, list[int]] = {}
    for name, dep, value in re.findall(
        rf'^engineroom_gateway_(requests|failures)_total{{model="{re.escape(MODEL)}",'
        rf'deployment="([^"]+)"[^}}]*}} (\d+)$',
        text,
        re.MULTILINE,
    ):
        counts.setdefault(dep, [0, 0])[name == "failures"] = int(value)
    return {dep: (c[0], c[1]) for dep, c in counts.items()}


def test_a_rolling_restart_restarts_each_deployment_canary_first_and_drops_no_request(
    demo, tmp_path
):
    fleet = load_fleet(demo.fleet)
    model = next(m for m in fleet.models if m.name == MODEL)
    deployments = [d.id for d in model.deployments]
    assert len(deployments) == 2 and all(d.profile for d in model.deployments)
    before = engine_pids(demo)
    assert all(before[dep][1] == "ready" for dep in deployments), before
    counts = wait_until(
        lambda: (c := gateway_counts(demo)) and all(c.get(d, (0, 0))[0] for d in deployments) and c,
        60, interval=0.5, what="client traffic through the gateway to both deployments",
    )  # fmt: skip

    plan = tmp_path / "plan.json"
    rc, out = cli("rollout", "plan", "--restart", "--model", MODEL, "--tolerance", TOLERANCE,
                  "--fleet", str(demo.fleet), "--out", str(plan))  # fmt: skip
    assert rc == 0, out
    rc, out = cli("rollout", "run", str(plan), "--fleet", str(demo.fleet), "--wait", timeout=300)
    assert rc == 0, out
    rollout_id = re.search(r"rollout (\w+): succeeded", out)
    assert rollout_id, out

    gateway = fleet.gateway
    assert gateway is not None
    record = httpx.get(
        f"{gateway.url}/admin/rollouts/{rollout_id[1]}", headers=HEADERS, timeout=10
    ).json()
    assert record["status"] == "succeeded"
    steps = record["steps"]
    # One step a deployment, the canary first, each done by its agent's restart job.
    assert [s["deployment"] for s in steps] == deployments
    assert [s["canary"] for s in steps] == [True, False]
    assert all(s["state"] == "done" and s["operation"] == "restart" for s in steps)
    for step in steps:
        agent = fleet.node(step["node"]).agent
        job = demo.get(f"{agent}/v1/jobs/{step['agent_jobs']['operation']}").json()
        assert (job["kind"], job["state"]) == ("engine.restart", "succeeded"), job
    assert steps[0]["ended"] <= steps[1]["started"]

    # Each engine is a new process now, ready, and the clients' traffic reaches it again.
    after = engine_pids(demo)
    for dep in deployments:
        assert after[dep][1] == "ready", after
        assert after[dep][0] != before[dep][0], (before, after)
    ended = gateway_counts(demo)
    wait_until(
        lambda: all(gateway_counts(demo)[d][0] > ended[d][0] for d in deployments),
        30, interval=0.5, what="client requests to both restarted deployments",
    )  # fmt: skip
    # No request through the gateway failed on either deployment while they restarted.
    assert {d: ended[d][1] for d in deployments} == {d: counts[d][1] for d in deployments}
