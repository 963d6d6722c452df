"""The start preflight gives one verdict per GPU (issue 28, defect 8: the Start vLLM form
listed `FAIL gpus GPU 1 is held by engine vllm-18015` and `ok gpus GPU 1 idle, 140.4 GiB
free` in one list). A real agent in this process over the NVML TEST DOUBLE
(tests/nvml_double.py): a GPU held by a loading start reads idle to NVML."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import VIEWER
from tests.engines.servers import free_port, wait_until
from tests.nvml_double import FakeGpu
from tests.test_agent_hardening import (
    GIB,
    InProcessAgent,
    cancel,
    double_agent,
    job_of,
    post,
    setup,  # noqa: F401 - the fixture the agent's fleet file is written with
    start_double,
    submit,
    until_ended,
    until_loading,
)


@pytest.fixture
def two_gpu_agent(setup) -> Iterator[InProcessAgent]:  # noqa: F811
    idle = [FakeGpu(mem_used=0, mem_total=140 * GIB) for _ in range(2)]
    yield from double_agent(setup, idle, env='DOUBLE_NEVER_READY = "1"')


def test_a_gpu_a_loading_start_holds_gets_one_verdict_in_the_plan(two_gpu_agent):
    agent = two_gpu_agent
    first_id = start_double(agent.url)
    try:
        until_loading(agent.url, first_id)
        # NVML reads both GPUs idle: the loading engine has touched neither yet.
        other = {"kind": "vllm.start", "profile": "double", "overrides": {"port": free_port()}}
        plan = post(agent.url, "/v1/jobs/plan", other, token=VIEWER).json()
        gpus = [c for c in plan["checks"] if c["name"] == "gpus"]
        assert len(gpus) == 1, plan["checks"]  # one verdict for the GPUs, not two
        (check,) = gpus
        assert not check["ok"] and not plan["ok"]
        held = f"held by job {first_id} (vllm.start of "
        assert check["detail"].count(held) == 2, check["detail"]  # GPU 0 and GPU 1, once each
        assert "idle" not in check["detail"], check["detail"]
    finally:
        cancel(agent.url, first_id)
    # The hold ends with the job: the GPUs read idle again, one verdict still.
    plan = post(agent.url, "/v1/jobs/plan", other, token=VIEWER).json()
    (check,) = [c for c in plan["checks"] if c["name"] == "gpus"]
    assert check["ok"] and check["detail"] == (
        "GPU 0 idle, 140.0 GiB free; GPU 1 idle, 140.0 GiB free"
    )


@pytest.fixture
def ready_gpu_agent(setup) -> Iterator[InProcessAgent]:  # noqa: F811
    yield from double_agent(setup, [FakeGpu(mem_used=0, mem_total=140 * GIB)], env="")


def test_a_running_engine_holds_its_gpu_once_and_its_restart_is_not_held_by_itself(
    ready_gpu_agent,
):
    agent = ready_gpu_agent
    start_id = start_double(agent.url)
    done = until_ended(agent.url, start_id, 60, what="the engine started")
    assert done["state"] == "succeeded", done
    engine = done["result"]["engine_id"]
    other = {"kind": "vllm.start", "profile": "double", "overrides": {"port": free_port()}}
    plan = post(agent.url, "/v1/jobs/plan", other, token=VIEWER).json()
    (check,) = [c for c in plan["checks"] if c["name"] == "gpus"]
    assert check["detail"] == f"GPU 0 is held by engine {engine} (started by job {start_id})"
    # A restart holds the engine's GPU from its stop to its start: its own preflight
    # must not read that hold as another's.
    restart_id = submit(agent.url, {"kind": "engine.restart", "engine": engine})
    again = until_ended(agent.url, restart_id, 90, what="the restart")
    assert again["state"] == "succeeded", again
    stop = post(agent.url, "/v1/jobs", {"kind": "engine.stop", "engine": engine})
    wait_until(lambda: job_of(agent.url, stop.json()["id"])["state"] != "running", 60)
