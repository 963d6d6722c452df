"""SimulatedNvml through the agent's real GpuSampler, and the simulated traffic's counters."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import pytest

from console.agent.gpu import GpuSampler
from console.sim.load import Traffic, Workload
from console.sim.nvml import GpuSpec, NVMLError_Timeout, SimulatedNvml, Tenant
from tests.engines.servers import wait_until


@dataclass
class Steady:
    gpu_busy: float
    batch_fill: float


def test_gpus_follow_their_engines_and_say_why_clocks_drop():
    busy, capped = Steady(0.95, 0.3), Steady(0.97, 1.0)
    specs = [
        GpuSpec(),
        GpuSpec([Tenant(101, busy, 0.9)]),
        GpuSpec([Tenant(102, capped, 0.9)]),
        GpuSpec([Tenant(103, busy, 0.9)], hot=True),
        GpuSpec(ecc_uncorrected=2),
    ]
    sampler = GpuSampler(SimulatedNvml("gpu-t1", specs))
    try:
        idle, loaded, at_cap, hot, ecc = sampler.read()
    finally:
        sampler.close()
    assert sampler.driver_version and sampler.driver_version.endswith("-sim")
    assert idle.utilization_pct == 0 and idle.clock_event_reasons == ["idle"]
    assert idle.sm_clock_mhz == 345 and idle.processes == []
    assert loaded.utilization_pct and loaded.utilization_pct > 80
    assert loaded.clock_event_reasons == []
    assert [p.pid for p in loaded.processes or []] == [101]
    assert loaded.memory_used_bytes == int(0.9 * 143771 * 2**20)
    assert "software power cap" in (at_cap.clock_event_reasons or [])
    assert at_cap.power_w and 650 <= at_cap.power_w <= 700
    assert hot.temperature_c and 88 <= hot.temperature_c <= 92
    assert "software thermal slowdown" in (hot.clock_event_reasons or [])
    assert ecc.ecc_uncorrected == 2 and (ecc.remapped_rows or {}).get("pending") is True


def test_the_xid_wait_blocks_like_the_driver_and_an_xid_arrives():
    nvml = SimulatedNvml("gpu-t1", [GpuSpec()])
    started = time.monotonic()
    with pytest.raises(NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(nvml.nvmlEventSetCreate(), 300)
    assert time.monotonic() - started >= 0.28  # it waited, it did not spin

    sampler = GpuSampler(SimulatedNvml("gpu-t1", [GpuSpec(), GpuSpec(xid=94)], xid_after_s=0.2))
    try:
        gpus = wait_until(
            lambda: (g := sampler.read()) and g[1].xid_events and g, timeout=5, what="XID 94"
        )
    finally:
        sampler.close()
    assert [e.xid for e in gpus[1].xid_events] == [94] and gpus[0].xid_events == []


def test_counters_and_histograms_only_grow():
    traffic = Traffic(6.0, 1500, 250, 64, 100_000, 0.1, 0.02, queue_surge=True)
    workload = Workload(traffic, seed=1, start=0.0, responses=True)
    previous = None
    for t in range(1, 400):
        workload.tick(float(t))
        now = (
            workload.requests_total,
            workload.generation_total,
            *workload.ttft.cumulative(),
            *workload.itl.cumulative(),
            *workload.e2e.cumulative(),
        )
        if previous is not None:
            assert all(b >= a for a, b in zip(previous, now, strict=True))
        previous = now
    assert workload.requests_total > 1000
    cumulative = workload.ttft.cumulative()
    assert cumulative == sorted(cumulative)
    assert list(itertools.accumulate(workload.ttft.counts)) == cumulative
