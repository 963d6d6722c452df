"""The demo's rebuild drill reports the node it runs on: one driver, one GPU.

The drill's preflight reads the node's facts from NVML (the demo's SIMULATED NVML) and
runs the drill's version probe (the TensorRT-LLM TEST DOUBLE's `trtllm-versions`), whose
line is in the drill's log. Both are on the drill screen: the preflight step's detail
and the log. They named two drivers (issue 28, defect 10): the probe must report what
the node has.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from console.core.config.load import load_fleet
from console.sim.nvml import GpuSpec, SimulatedNvml
from tests.engines.servers import wait_until
from tests.sim.conftest import TOKEN, SimFleet, end, start_sim


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    sim = start_sim(tmp_path_factory.mktemp("demo-drill"), "--nodes", "2")
    yield sim
    end(sim)


def test_the_drills_probe_and_its_preflight_name_the_nodes_driver(demo: SimFleet):
    import httpx

    fleet = load_fleet(demo.fleet)
    (name, drill), *_ = fleet.drills.items()
    found = fleet.deployment(drill.deployment)
    assert found is not None
    agent = fleet.node(found[1].node).agent
    headers = {"Authorization": f"Bearer {TOKEN}"}
    asked = httpx.post(
        f"{agent}/v1/jobs", json={"kind": "drill.run", "drill": name}, headers=headers, timeout=10
    )
    assert asked.status_code == 202, asked.text
    job_id = asked.json()["id"]

    def preflight_ended() -> dict | None:
        job = demo.get(f"{agent}/v1/jobs/{job_id}").json()
        step = next(s for s in job["steps"] if s["name"] == "preflight")
        return job if step["state"] not in ("pending", "running") else None

    try:
        job = wait_until(preflight_ended, 60, interval=0.2, what="the drill's preflight")
        log = demo.get(f"{agent}/v1/jobs/{job_id}/log?tail=200").text
    finally:
        httpx.delete(f"{agent}/v1/jobs/{job_id}", headers=headers, timeout=30)
    preflight = next(s for s in job["steps"] if s["name"] == "preflight")
    assert preflight["state"] == "succeeded", preflight
    probed = next(
        json.loads(line[line.index("{") :])
        for line in log.splitlines()
        if '"tensorrt_llm"' in line and "{" in line
    )
    nvml = SimulatedNvml("gpu-a1", [GpuSpec()])  # what the demo's agents read
    driver = nvml.nvmlSystemGetDriverVersion()
    gpu = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
    # The node's facts (NVML), the probe's line and the step's detail: one driver, one GPU.
    assert job["result"]["versions"]["driver"] == driver
    assert (probed["driver"], probed["gpu"]) == (driver, gpu)
    assert f"driver {driver}," in preflight["detail"] and f"GPU {gpu}," in preflight["detail"]
    assert "580.159.04" not in log
