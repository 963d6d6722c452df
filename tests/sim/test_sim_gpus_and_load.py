"""SimulatedNvml through the agent's real GpuSampler, and the simulated traffic's counters."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import pytest

from console.agent.snapshot.gpu import GpuSampler
from console.sim.load import Routed, Traffic, Workload
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


def test_routed_traffic_follows_the_client_requests_and_queues_past_the_batch():
    """The demo's engines take the traffic the gateway sends them (issue 28, defect 14):
    each client request stands for `stands_for` users' requests over the last window. None
    sent: the engine empties. More than its batch takes: a queue, and first tokens wait."""
    traffic = Traffic(7.0, 1500, 220, 128, 320_000, 0.07, 0.009, max_output=256)
    workload = Workload(traffic, seed=3, start=0.0, responses=True, routed=Routed(10.0, 7.0))
    capacity = workload.capacity()

    def run(seconds: range, per_second: float) -> None:
        carry = 0.0
        for t in seconds:
            carry += per_second
            while carry >= 1:
                workload.arrived(float(t))
                carry -= 1
            workload.tick(float(t))

    run(range(1, 61), 0.7)  # what the fleet expects: about its 7 requests a second
    assert 4.0 < workload.rate(60.0) < 10.0 and workload.waiting < 1
    assert workload.batch > 0 and 0 < workload.kv_usage < 0.5
    run(range(61, 121), 0.0)  # weight 0: no client request reaches it
    assert workload.rate(120.0) == 0.0
    assert workload.batch == 0 and workload.kv_usage == 0.0 and workload.waiting < 1e-9
    served = workload.requests_total
    run(range(121, 241), 0.5 * capacity)  # five times what its batch finishes
    assert workload.rate(240.0) > 1.5 * capacity
    assert workload.waiting > 100 and workload.batch >= traffic.max_seqs - 1
    assert workload.requests_total > served
    assert workload.plan(240.0, prompt_tokens=10, max_tokens=8).queue_s > 1.0
