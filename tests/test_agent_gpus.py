"""GPU handling in the agent, on the FakeNvml test double (no GPU on these machines).

The real NVML path is checked on the device machine's H200 (docs/agent-on-h200.md).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from console.agent.snapshot.discovery import EngineProcess
from console.agent.snapshot.gpu import GpuSampler, decode_clock_event_reasons
from console.agent.snapshot.node import NodeAgent
from console.core.config.load import parse_fleet
from plugins.base import Discovered
from tests.engines.servers import wait_until
from tests.nvml_double import FakeGpu, FakeNvml

FLEET = parse_fleet("""\
[fleet]
name = "t"
[agent]
discover = false
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9410"
""")


def test_clock_event_reasons_are_words():
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x1 | 0x40) == ["idle", "hardware thermal slowdown"]
    assert decode_clock_event_reasons(0x4 | 0x10000) == ["software power cap", "other (0x10000)"]


def test_eight_gpus_each_with_their_own_values():
    nvml = FakeNvml([FakeGpu(util=10 * i, mem_used=i * 2**30, temp=40 + i) for i in range(8)])
    nvml.gpus[3].ecc = None  # NotSupported: unknown, and not an error
    sampler = GpuSampler(nvml)
    gpus = sampler.read()
    sampler.close()
    assert sampler.driver_version == "580.159.04"
    assert sampler.cuda_driver_version == "13.0"
    assert [g.utilization_pct for g in gpus] == [0, 10, 20, 30, 40, 50, 60, 70]
    assert gpus[5].memory_used_bytes == 5 * 2**30
    assert gpus[7].temperature_c == 47
    assert gpus[0].power_w == 90 and gpus[0].power_limit_w == 700
    assert gpus[0].compute_capability == "9.0"
    assert gpus[0].clock_event_reasons == ["idle"]
    assert gpus[3].ecc_uncorrected is None and gpus[3].errors == []
    assert gpus[2].ecc_uncorrected == 0


def test_a_lost_gpu_is_reported_and_the_others_still_read():
    nvml = FakeNvml([FakeGpu(util=50), FakeGpu(util=60)])
    sampler = GpuSampler(nvml)
    nvml.gpus[0].lost = True
    gpus = sampler.read()
    sampler.close()
    assert gpus[0].utilization_pct is None
    assert "utilization: GPU is lost" in gpus[0].errors
    assert gpus[1].utilization_pct == 60


def test_xid_critical_errors_arrive_through_the_event_thread():
    nvml = FakeNvml([FakeGpu(), FakeGpu()])
    sampler = GpuSampler(nvml)
    nvml.xid_queue.append((1, 79))
    gpus = wait_until(
        lambda: (g := sampler.read()) and g[1].xid_events and g, timeout=5, what="XID 79 on GPU 1"
    )
    sampler.close()
    assert [e.xid for e in gpus[1].xid_events] == [79]
    assert gpus[0].xid_events == []


async def test_gpu_processes_map_to_the_engine_that_owns_them():
    # A real process tree: an "engine" whose child holds the GPU, like vLLM's EngineCore.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import subprocess, sys, time; "
                "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                "print(c.pid, flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        nvml = FakeNvml([FakeGpu(processes=[(child, 3 * 2**30)]), FakeGpu(processes=[(1, 1)])])
        agent = NodeAgent(FLEET, "local", gpu=GpuSampler(nvml))
        agent.engines.merge(
            [EngineProcess("vllm", parent.pid, 0.0, [], Discovered("http://127.0.0.1:1"))],
            time.time(),
        )
        snap = await agent.cycle()
        await agent.close()
    finally:
        parent.kill()
    [proc] = snap.gpus[0].processes or []
    assert proc.pid == child
    assert proc.engine_id == "vllm-1"
    assert proc.used_memory_bytes == 3 * 2**30
    assert (snap.gpus[1].processes or [])[0].engine_id is None  # pid 1 is no engine's


async def test_a_hung_driver_keeps_the_last_values_and_says_so():
    nvml = FakeNvml([FakeGpu(util=42)])
    agent = NodeAgent(FLEET, "local", gpu=GpuSampler(nvml))
    agent.nvml_deadline_s = 0.5
    first = await agent.cycle()
    assert first.gpu_status == "ok"
    nvml.hang.set()
    started = time.monotonic()
    hung = await agent.cycle()
    assert time.monotonic() - started < 5  # bounded by the deadline, not by the driver
    assert hung.gpu_status.startswith("NVML did not answer within 0.5 s")
    assert hung.gpus[0].utilization_pct == 42  # the last good value, marked by the status
    again = await agent.cycle()  # the hung call is still out: no second call piles up
    assert again.gpu_status.startswith("NVML is not answering")
    nvml.hang.clear()
    nvml.release.set()
    recovered = await wait_for_status(agent, "ok")
    assert recovered.gpus[0].utilization_pct == 42
    await agent.close()


async def wait_for_status(agent: NodeAgent, status: str):
    import asyncio

    for _ in range(50):
        snap = await agent.cycle()
        if snap.gpu_status == status:
            return snap
        await asyncio.sleep(0.1)
    pytest.fail(f"gpu_status never became {status!r}")


async def test_a_hung_mount_keeps_the_last_host_values_and_says_so():
    agent = NodeAgent(FLEET, "local", gpu=GpuSampler(FakeNvml([FakeGpu()])))
    first = await agent.cycle()
    assert first.host.error is None and first.host.mem_total_bytes
    release = threading.Event()
    agent._disks.fn = lambda: release.wait(30)  # statvfs on a hung NFS mount
    agent._disks.deadline_s = 0.3
    started = time.monotonic()
    hung = await agent.cycle()
    assert time.monotonic() - started < 5
    assert hung.host.error.startswith("host statistics did not answer within 0.3 s")
    assert hung.host.mem_total_bytes == first.host.mem_total_bytes  # the last good values
    release.set()
    await agent.close()
