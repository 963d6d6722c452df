"""Failover on the demo fleet: the REAL gateway and agents over SIMULATED engines, as an
operator drives them (`engineroom failover`). The simulated traffic follows the gateway's
weights, a planned failover from TensorRT-LLM to vLLM passes, and so does the fail-back,
which gives every replica its weight back (issue 28, defects 7 and 14)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from console.core.config.load import load_fleet
from tests.engines.servers import wait_until
from tests.sim.conftest import ROOT, TOKEN, SimFleet, end, start_sim

MODEL = "llama-3.1-8b-instruct"
TRT, VLLM = "llama8b-trt-a1", "llama8b-vllm-a2"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    # A 10 s rate window and 3 s checks (the demo's: 60 s and 10 s): the same moves, and
    # the gateway tops a short window's requests up to 20 with its own (90 s less).
    sim = start_sim(tmp_path_factory.mktemp("demo-failover"), "--nodes", "2",
                    "--window", "10", "--verify", "3")  # fmt: skip
    yield sim
    end(sim)


def failover(demo: SimFleet, *args: str) -> subprocess.CompletedProcess[str]:
    """`engineroom failover MODEL ARGS --wait`, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEROOM_")}
    env["ENGINEROOM_DEMO_TOKEN"] = TOKEN
    return subprocess.run(
        [sys.executable, "-m", "console.cli", "failover", MODEL, "--fleet", str(demo.fleet),
         *args, "--wait"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip


def weights(demo: SimFleet) -> dict[str, int]:
    gateway = load_fleet(demo.fleet).gateway
    assert gateway is not None
    routes = demo.get(f"{gateway.url}/admin/routes").json()[MODEL]["deployments"]
    return {d["id"]: d["weight"] for d in routes}


def engine_figures(demo: SimFleet) -> dict[str, tuple[float | None, float | None, float | None]]:
    """Per deployment of the model, what its engine reports through the agent: (request
    rate, requests running, KV cache)."""
    out = {}
    for snap in demo.snapshots().values():
        for engine in snap.engines:
            for model in engine.models:
                if model.name in (MODEL, "ensemble"):
                    for dep in engine.deployment_ids:
                        out[dep] = (model.request_rate, model.requests_running,
                                    model.kv_cache_usage)  # fmt: skip
    return out


def test_traffic_follows_the_weights_and_a_planned_failover_and_fail_back_pass(demo):
    start = weights(demo)
    assert start[TRT] == 100 and start[VLLM] == 100  # the demo's two replicas share it
    wait_until(
        lambda: all((engine_figures(demo).get(d) or (0,))[0] for d in (TRT, VLLM)),
        60, what="both replicas serving",
    )  # fmt: skip
    before = engine_figures(demo)

    away = failover(demo, "--to", VLLM)
    assert away.returncode == 0, away.stdout + away.stderr
    assert "shift 100%   succeeded" in away.stdout, away.stdout
    assert weights(demo)[TRT] == 0

    # Traffic follows the weights: TensorRT-LLM's engine has nothing to do, vLLM's has
    # all of it (issue 28 #14: weight-0 deployments went on at 5.7-11 requests/s).
    def drained() -> dict | None:
        now = engine_figures(demo)
        rate, running, kv = now[TRT]
        return now if rate == 0 and running == 0 and kv is not None and kv < 0.01 else None

    now = wait_until(drained, 150, interval=2, what=f"{TRT}'s engine idle")
    assert (now[VLLM][0] or 0) > (before[VLLM][0] or 0) * 1.4, (before, now)

    back = failover(demo, "--to", TRT)
    assert back.returncode == 0, back.stdout + back.stderr
    assert "fail-back to llama8b-trt-a1: the weights from before job" in back.stdout
    # Every verification window judged enough requests to mean something.
    assert "shift 10%    succeeded" in back.stdout, back.stdout
    # The fail-back restores the weights from before the failover: the vLLM replica keeps
    # its share (it went to 0 before), and the standby stays at 0.
    assert weights(demo) == start
    wait_until(lambda: (engine_figures(demo)[TRT][1] or 0) > 0, 60, what=f"{TRT} serving")
