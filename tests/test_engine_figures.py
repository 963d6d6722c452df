"""The engine figures the diagnoses read (issue 30): generation tokens and preemptions per
second, waiting requests by reason, the prefix cache's hit rate and the API server's CPU.

Read from recorded engine answers (tests/fixtures: vLLM 0.32.0 and Triton 2.51.0 as
scraped; trtllm-serve constructed), through the agent's window, its /metrics and the
Prometheus source's reader; a figure an engine does not export stays unknown (None).
The real engines' side is in tests/test_agent_real_engines.py and
tests/test_prometheus_source.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from console.agent.api.exposition import render
from console.agent.snapshot.discovery import EngineProcess
from console.agent.snapshot.engines import Tracked, _api_server_cpu
from console.collect.prometheus.promql import Point, Sample, fleet_queries
from console.collect.prometheus.read import FleetReader, NodeReadings
from console.core import diagnosis as d
from console.core.config.load import parse_fleet
from console.core.metrics.readings import (
    MAX_REASON_CHARS,
    MAX_WAITING_REASONS,
    OTHER_REASON,
    ModelReading,
    capped_reasons,
)
from console.core.metrics.window import ModelWindow
from console.core.plugin import Discovered, EngineTarget, plugin_kinds
from console.core.wire import Engine, Host, ModelStats, NodeInfo, Snapshot
from plugins.triton import TritonPlugin, read_models
from plugins.trtllm import TrtllmPlugin, prometheus_models
from plugins.vllm import VllmPlugin, read_metrics
from tests.support.fleet import fleet_model, fleet_toml

FIXTURES = Path(__file__).parent / "fixtures"


def vllm_text(name: str) -> str:
    return (FIXTURES / f"vllm-0.32.0.{name}.txt").read_text()


def window_over(readings: list[tuple[float, ModelReading]]) -> ModelStats:
    window = ModelWindow(60.0)
    for t, reading in readings:
        window.add(t, reading)
    return window.stats()


# -- vLLM --------------------------------------------------------------------------------


def test_real_vllm_0_32_counts_preemptions_prefix_cache_and_waiting_reasons():
    [busy] = read_metrics(vllm_text("busy.metrics"), ["tiny"])
    assert busy.counters["generation_tokens"] == 130
    assert busy.counters["preemptions"] == 0  # a real counter at 0: known, not missing
    assert busy.counters["prefix_cache_queries"] == 34
    assert busy.counters["prefix_cache_hits"] == 0
    assert busy.waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}


def test_vllm_figures_over_the_window_and_across_a_restart():
    """idle -> after 8 requests -> busy: rates over the window; then the engine restarts
    (its counters read idle again): the window starts over and nothing is made of a
    negative delta; a second reading with nothing moved gives 0 tokens/s, and no hit rate
    (no query: not 0/0, not 0)."""
    idle, done, busy = (
        read_metrics(vllm_text(name), ["tiny"])[0]
        for name in ("idle.metrics", "metrics", "busy.metrics")
    )
    stats = window_over([(0.0, idle), (10.0, done)])
    assert stats.generation_tokens_rate == pytest.approx(12.8)  # 128 tokens in 10 s
    assert stats.preemption_rate == 0.0
    assert stats.prefix_cache_hit_rate == 0.0  # 28 token queries, none hit
    assert stats.requests_waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}

    window = ModelWindow(60.0)
    for t, reading in ((0.0, idle), (10.0, done), (20.0, busy)):
        window.add(t, reading)
    assert window.stats().generation_tokens_rate == pytest.approx(6.5)  # 130 in 20 s
    restarted = read_metrics(vllm_text("idle.metrics"), ["tiny"])[0]
    window.add(30.0, restarted)
    after = window.stats()
    assert after.generation_tokens_rate is None and after.preemption_rate is None
    assert after.prefix_cache_hit_rate is None
    assert after.requests_waiting_by_reason == {"capacity": 0.0, "deferred": 0.0}  # a gauge
    window.add(40.0, read_metrics(vllm_text("idle.metrics"), ["tiny"])[0])
    still = window.stats()
    assert still.generation_tokens_rate == 0.0 and still.preemption_rate == 0.0
    assert still.prefix_cache_hit_rate is None  # queries did not move


def test_generation_stalled_is_how_long_requests_have_been_in_with_no_token():
    """What the wedged-engine diagnosis reads. Tokens rose between 10 s and 20 s, then not
    while two requests stayed in (a stopped engine core keeps its counters): stalled 25 s
    at 45 s. An idle engine is not stalled, however long it idled; one that just got a
    request has stalled one scrape at most, not its idle time (before: 52 s, a false
    'wedged' on the first request after a quiet minute, seen in bench.diagnose_time).
    A restart starts the window over (one reading: unknown). Triton, with no token
    counter, is never stalled, only unknown (the test below)."""
    idle, done, busy = (
        read_metrics(vllm_text(name), ["tiny"])[0]
        for name in ("idle.metrics", "metrics", "busy.metrics")
    )
    stalled = [(0.0, idle), (10.0, done), (20.0, busy), (30.0, busy), (45.0, busy)]
    assert window_over(stalled).generation_stalled_s == 25.0
    quiet = [(0.0, done), (10.0, done), (40.0, done), (50.0, done)]
    assert window_over(quiet).generation_stalled_s == 0.0
    arrived = replace(done, requests_running=1.0)  # in, no token yet
    assert window_over([*quiet, (52.0, arrived)]).generation_stalled_s == 2.0
    assert window_over([(0.0, idle), (20.0, done)]).generation_stalled_s == 0.0
    assert window_over([(0.0, busy), (10.0, idle)]).generation_stalled_s is None  # restarted


def test_a_prefix_cache_that_hits_gives_hits_over_queries_in_the_window():
    def text(hits: int, queries: int, preempted: int) -> str:
        labels = '{engine="0",model_name="m"}'
        return (
            f"vllm:num_requests_running{labels} 1\n"
            f"vllm:prefix_cache_hits_total{labels} {hits}\n"
            f"vllm:prefix_cache_queries_total{labels} {queries}\n"
            f"vllm:num_preemptions_total{labels} {preempted}\n"
        )

    first, second = (
        read_metrics(text(100, 400, 3), ["m"])[0],
        read_metrics(text(250, 600, 9), ["m"])[0],
    )
    stats = window_over([(0.0, first), (2.0, second)])
    assert stats.prefix_cache_hit_rate == pytest.approx(0.75)  # 150 hits of 200
    assert stats.preemption_rate == pytest.approx(3.0)  # 6 in 2 s


def test_preemptions_are_a_rate_over_the_last_10_s_so_a_storm_is_named_as_it_starts():
    """A minute with no preemption, then 8 in the last 4 s: the rate over the last 10 s of
    the window (0.8 a second, a storm at the default 0.5), not the minute's 0.13 (which a
    storm of 3.8 a second on real vLLM took 15 s to fill, bench.diagnose_time)."""

    def at(preempted: int) -> ModelReading:
        labels = '{engine="0",model_name="m"}'
        text = (
            f"vllm:num_requests_running{labels} 6\nvllm:num_preemptions_total{labels} {preempted}\n"
        )
        return read_metrics(text, ["m"])[0]

    quiet = [(float(t), at(0)) for t in range(0, 57, 2)]  # 0, 2, ... 56 s
    storm = window_over([*quiet, (58.0, at(3)), (60.0, at(8))])
    assert storm.window_s == 60.0 and storm.preemption_rate == pytest.approx(0.8)  # 8 in 10 s
    assert storm.preemption_rate >= d.DEFAULTS["kv_preemption_storm_rate"]
    gone = window_over([*quiet, (58.0, at(8)), *((float(t), at(8)) for t in range(60, 72, 2))])
    assert gone.preemption_rate == 0.0  # the storm left the last 10 s: over


def test_vllm_0_9_to_0_11_prefix_cache_names_and_no_waiting_reasons():
    labels = '{engine="0",model_name="m"}'
    old = (
        f"vllm:num_requests_waiting{labels} 2\n"
        f"vllm:gpu_prefix_cache_hits_total{labels} 5\n"
        f"vllm:gpu_prefix_cache_queries_total{labels} 20\n"
    )
    [model] = read_metrics(old, ["m"])
    assert (model.counters["prefix_cache_hits"], model.counters["prefix_cache_queries"]) == (5, 20)
    assert model.requests_waiting == 2
    assert model.waiting_by_reason is None  # before 0.13 vLLM does not say why: unknown
    [older] = read_metrics((FIXTURES / "vllm-0.9-style.metrics.txt").read_text(), ["llama-8b"])
    stats = window_over([(0.0, older), (5.0, older)])
    assert stats.requests_waiting_by_reason is None
    assert stats.preemption_rate is None  # the series is not there: unknown, not 0
    assert stats.prefix_cache_hit_rate is None
    assert stats.generation_tokens_rate == 0.0


@pytest.mark.parametrize(
    ("argv", "api_server"),
    [
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
        (["vllm", "serve", "m", "--port", "8000"], True),
        (["vllm", "serve", "m", "--data-parallel-size", "4"], False),  # 4 API servers
        (["vllm", "serve", "m", "-dp", "2", "--api-server-count", "1"], True),
        (["vllm", "serve", "m", "--api-server-count=3"], False),
    ],
)
def test_vllm_main_process_is_the_api_server_only_when_it_runs_one(argv, api_server):
    assert VllmPlugin().api_server_process(argv) is api_server


def test_triton_and_trtllm_serve_have_no_api_server_apart():
    """tritonserver answers HTTP and runs the backends in one process: its CPU says
    nothing of an API server. trtllm-serve's layout cannot be checked here: unknown."""
    assert TritonPlugin().api_server_process(["tritonserver", "--model-repository=r"]) is False
    assert TrtllmPlugin().api_server_process(["trtllm-serve", "m"]) is False


# -- Triton and trtllm-serve ---------------------------------------------------------------


def test_triton_cannot_tell_tokens_preemptions_reasons_or_prefix_cache():
    stats = json.loads((FIXTURES / "triton-2.51.0.stats.json").read_text())
    text = (FIXTURES / "triton-2.51.0.metrics.txt").read_text()
    [first] = read_models(["ensemble"], stats, text, frozenset({"ensemble"}))
    stats["model_stats"][0]["inference_stats"]["success"]["count"] += 5
    [second] = read_models(["ensemble"], stats, text, frozenset({"ensemble"}))
    window = window_over([(0.0, first), (5.0, second)])
    assert window.request_rate == pytest.approx(1.0)  # the window works...
    for figure in (
        "generation_tokens_rate",
        "preemption_rate",
        "prefix_cache_hit_rate",
        "requests_waiting_by_reason",
        "generation_stalled_s",
    ):
        assert getattr(window, figure) is None, figure  # ...and these stay unknown


def test_a_triton_model_with_requests_pending_and_none_finishing_has_stalled():
    """What the Triton-stall diagnosis reads (recorded answers of Triton 2.51.0): two
    requests pending while the success counter stays put: stalled 14 s at 14 s (back to the
    reading where nothing was in); one more
    success and it is 0 again. Tokens stay unknown (Triton counts none)."""
    stats = json.loads((FIXTURES / "triton-2.51.0.stats.json").read_text())
    text = (FIXTURES / "triton-2.51.0.metrics.txt").read_text()
    pending = text.replace(
        'nv_inference_pending_request_count{model="ensemble",version="1"} 0',
        'nv_inference_pending_request_count{model="ensemble",version="1"} 2',
    )
    assert pending != text
    [idle] = read_models(["ensemble"], stats, text, frozenset({"ensemble"}))
    [stuck] = read_models(["ensemble"], stats, pending, frozenset({"ensemble"}))
    assert stuck.requests_waiting == 2
    readings = [(0.0, idle), (2.0, stuck), (6.0, stuck), (14.0, stuck)]
    window = window_over(readings)
    assert window.completion_stalled_s == 14.0 and window.generation_stalled_s is None
    stats["model_stats"][0]["inference_stats"]["success"]["count"] += 1
    [moved] = read_models(["ensemble"], stats, pending, frozenset({"ensemble"}))
    assert window_over([*readings, (16.0, moved)]).completion_stalled_s == 0.0
    assert window_over([(0.0, idle), (30.0, idle)]).completion_stalled_s == 0.0  # idle


def test_trtllm_serve_generation_tokens_and_a_counter_reset():
    text = (FIXTURES / "trtllm-serve-1.3-style.prometheus.txt").read_text()
    [first] = prometheus_models(text, ["llama"])
    assert first.counters["generation_tokens"] == 4800
    moved = text.replace(
        'trtllm_generation_tokens_total{engine_type="undefined",model_name="undefined"} 4800',
        'trtllm_generation_tokens_total{engine_type="undefined",model_name="undefined"} 5400',
    )
    [second] = prometheus_models(moved, ["llama"])
    window = ModelWindow(60.0)
    window.add(0.0, first)
    window.add(2.0, second)
    stats = window.stats()
    assert stats.generation_tokens_rate == pytest.approx(300.0)
    # trtllm-serve exports no preemption counter, no reasons, and its KV-cache hit rate is
    # a gauge since start, not hits and queries: unknown over a window.
    assert stats.preemption_rate is None and stats.prefix_cache_hit_rate is None
    assert stats.requests_waiting_by_reason is None
    restarted = text.replace(
        'trtllm_generation_tokens_total{engine_type="undefined",model_name="undefined"} 4800',
        'trtllm_generation_tokens_total{engine_type="undefined",model_name="undefined"} 12',
    )
    window.add(4.0, prometheus_models(restarted, ["llama"])[0])
    assert window.stats().generation_tokens_rate is None  # not (12 - 5400) / 2


# -- waiting reasons are outside text ------------------------------------------------------


def test_waiting_reasons_are_capped_and_still_add_up():
    hostile = {f"reason-{i:03d}-" + "x" * 100: 1.0 for i in range(200)}
    capped = capped_reasons(hostile)
    assert len(capped) == MAX_WAITING_REASONS
    assert all(len(k) <= MAX_REASON_CHARS for k in capped)
    assert capped[OTHER_REASON] == 200 - (MAX_WAITING_REASONS - 1)
    assert sum(capped.values()) == 200
    assert capped_reasons({"capacity": 3.0}) == {"capacity": 3.0}
    text = "".join(
        f'vllm:num_requests_waiting_by_reason{{model_name="m",reason="r{i}"}} 1\n'
        for i in range(40)
    )
    [model] = read_metrics(text, ["m"])
    assert model.waiting_by_reason is not None
    assert len(model.waiting_by_reason) == MAX_WAITING_REASONS
    assert sum(model.waiting_by_reason.values()) == 40


# -- the API server's CPU ------------------------------------------------------------------

BUSY_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(child.pid, flush=True)
sys.stdin.read()  # the parent idles until told
child.kill()
"""


def test_the_api_server_cpu_is_its_process_alone_not_its_children():
    """A parent that idles while its child burns a core (vLLM's API server and its
    EngineCore): the parent's figure stays near 0; the child's, measured as the process
    itself, is near a core. The first probe of a process has no figure (not 0)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", BUSY_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        import psutil

        def tracked(pid: int) -> Tracked:
            proc = psutil.Process(pid)
            process = EngineProcess(
                "vllm",
                pid,
                proc.create_time(),
                ["vllm", "serve", "m"],
                Discovered("http://127.0.0.1:1"),
            )
            return Tracked(EngineTarget("vllm-1", "vllm", "http://127.0.0.1:1"), process=process)

        plugin = VllmPlugin()
        server, core = tracked(parent.pid), tracked(child_pid)
        assert _api_server_cpu(server, plugin, "ready") is None  # first probe: unknown
        assert _api_server_cpu(core, plugin, "ready") is None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # at least a second of CPU to compare
            if sum(psutil.Process(child_pid).cpu_times()[:2]) > 1.5:
                break
            time.sleep(0.1)
        busy = _api_server_cpu(core, plugin, "ready")
        idle = _api_server_cpu(server, plugin, "ready")
        assert busy is not None and busy > 30, busy  # a core, shared with the others here
        assert idle is not None and idle < 10, idle
        assert _api_server_cpu(server, plugin, "down") is None  # gone: unknown
        # A process that is not the API server alone has no figure.
        dp = tracked(parent.pid)
        assert dp.process is not None
        dp.process.cmdline = ["vllm", "serve", "m", "--data-parallel-size", "2"]
        assert _api_server_cpu(dp, plugin, "ready") is None
        assert _api_server_cpu(dp, plugin, "ready") is None
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=10)


# -- the agent's /metrics ------------------------------------------------------------------


def snapshot_with(model: ModelStats, cpu: float | None) -> Snapshot:
    engine = Engine(id="vllm-8000", kind="vllm", state="ready", models=[model])
    engine.api_server_cpu_pct = cpu
    return Snapshot(
        node=NodeInfo(name="n1", agent_version="t", time=0.0),
        host=Host(),
        gpu_status="ok",
        engines=[engine],
    )


def test_the_agents_metrics_carry_the_figures_and_leave_unknown_ones_out():
    known = ModelStats(
        name="m",
        generation_tokens_rate=12.5,
        preemption_rate=0.0,
        prefix_cache_hit_rate=0.25,
        requests_waiting_by_reason={"capacity": 3.0, 'odd"reason': 1.0},
    )
    text = render(snapshot_with(known, 41.5))
    base = 'node="n1",engine="vllm-8000",kind="vllm",model="m"'
    assert f"engineroom_model_generation_tokens_rate{{{base}}} 12.5" in text
    assert f"engineroom_model_preemption_rate{{{base}}} 0" in text  # known 0 is written
    assert f"engineroom_model_prefix_cache_hit_ratio{{{base}}} 0.25" in text
    assert f'engineroom_model_requests_waiting_by_reason{{{base},reason="capacity"}} 3' in text
    assert f'engineroom_model_requests_waiting_by_reason{{{base},reason="odd\\"reason"}} 1' in text
    assert (
        'engineroom_engine_api_server_cpu_percent{node="n1",engine="vllm-8000",kind="vllm"} 41.5'
        in text
    )
    blind = render(snapshot_with(ModelStats(name="m"), None))
    for name in (
        "engineroom_model_generation_tokens_rate",
        "engineroom_model_preemption_rate",
        "engineroom_model_prefix_cache_hit_ratio",
        "engineroom_model_requests_waiting_by_reason",
        "engineroom_engine_api_server_cpu_percent",
    ):
        assert f"# TYPE {name} gauge" in blind
        assert f"\n{name}{{" not in blind, name  # unknown is left out, never 0


# -- the Prometheus source -----------------------------------------------------------------


def prometheus_fleet(**deployment: object) -> str:
    """Model m on node n1's vLLM (`deployment`: its keys besides), read through Prometheus."""
    return fleet_toml(
        fleet={"name": "p"},
        nodes=[{"name": "n1"}],
        models=[fleet_model("m", {"id": "m-vllm", "node": "n1", "engine": "vllm",
                                  "endpoint": "http://10.0.0.1:8000", **deployment})],
        prometheus={"url": "http://127.0.0.1:1"},
    )  # fmt: skip


def reader_and_queries():
    fleet = parse_fleet(prometheus_fleet())
    assert fleet.prometheus is not None
    engines = {k: c.prometheus for k, c in plugin_kinds().items() if c.prometheus}
    queries = {(q.kind, q.family): q for q in fleet_queries(fleet.prometheus, engines)}
    return FleetReader(fleet, fleet.prometheus, engines), queries


def sample(value: str, **labels: str) -> Sample:
    return Sample(labels, Point(0.0, value))


AT = {"instance": "10.0.0.1:8000", "model_name": "m"}  # prometheus_fleet's vLLM, model m


def read_vllm(
    reader: FleetReader, queries: dict, gauges: list[Sample], counters: list[Sample] | None = None
) -> Snapshot:
    """Node n1 as the reader makes it of these answers to its vLLM gauge (and counter)
    queries."""
    nodes: dict[str, NodeReadings] = {}
    reader.read(queries[("vllm", "gauges")], gauges, nodes)
    if counters is not None:
        reader.read(queries[("vllm", "counters")], counters, nodes)
    return reader.snapshot("n1", nodes["n1"], time.time())


def test_the_engines_own_series_through_prometheus_become_the_same_figures():
    reader, queries = reader_and_queries()
    counters, gauges = queries[("vllm", "counters")], queries[("vllm", "gauges")]
    assert "vllm:generation_tokens_total" in counters.expr
    assert "vllm:num_preemptions_total" in counters.expr
    assert "vllm:prefix_cache_hits_total" in counters.expr
    assert "process_cpu_seconds_total" in counters.expr
    # Only the engine's own target's process: any exporter has process_cpu_seconds_total.
    nl = "node, Hostname, instance"  # the node labels, then the target's
    assert f"and on ({nl}) group by ({nl}) (vllm:num_requests_running)" in counters.expr
    assert f"sum by (__name__, {nl}, model_name, reason)" in gauges.expr
    snap = read_vllm(
        reader,
        queries,
        [
            sample("1", __name__="vllm:num_requests_running", **AT),
            sample("4", __name__="vllm:num_requests_waiting", **AT),
            sample("3", __name__="vllm:num_requests_waiting_by_reason", reason="capacity", **AT),
            sample("1", __name__="vllm:num_requests_waiting_by_reason", reason="deferred", **AT),
        ],
        [
            sample("42.5", er_figure="generation_tokens_rate", **AT),
            sample("0", er_figure="preemption_rate", **AT),
            sample("NaN", er_figure="prefix_cache_hit_rate", **AT),  # 0/0: no query
            sample("37.5", er_figure="api_server_cpu", instance="10.0.0.1:8000"),
        ],
    )
    [engine] = snap.engines
    [model] = engine.models
    assert [m.name for m in engine.models] == ["m"]  # the CPU sample made no model "?"
    assert engine.api_server_cpu_pct == 37.5
    assert model.generation_tokens_rate == 42.5
    assert model.preemption_rate == 0.0
    assert model.prefix_cache_hit_rate is None  # NaN is no traffic, never 0
    assert model.requests_waiting_by_reason == {"capacity": 3.0, "deferred": 1.0}
    assert reader.refused == {}


def test_figures_out_of_range_through_prometheus_are_refused_and_named():
    reader, queries = reader_and_queries()
    snap = read_vllm(
        reader,
        queries,
        [
            sample("1", __name__="vllm:num_requests_running", **AT),
            sample("-2", __name__="vllm:num_requests_waiting_by_reason", reason="capacity", **AT),
            sample("1", __name__="vllm:num_requests_waiting_by_reason", reason="deferred", **AT),
        ],
        [
            sample("-5", er_figure="generation_tokens_rate", **AT),
            sample("1.5", er_figure="prefix_cache_hit_rate", **AT),
            sample("-1", er_figure="api_server_cpu", instance="10.0.0.1:8000"),
        ],
    )
    [engine] = snap.engines
    [model] = engine.models
    assert model.generation_tokens_rate is None
    assert model.prefix_cache_hit_rate is None
    assert model.requests_waiting_by_reason is None  # one reason refused: the split unknown
    assert engine.api_server_cpu_pct is None
    count, first = reader.refused["n1"]
    assert count == 4 and "out of range" in first


def test_the_agents_series_through_prometheus_become_the_same_figures():
    reader, queries = reader_and_queries()
    agent_model = queries[(None, "agent_model")]
    assert "engineroom_engine_api_server_cpu_percent" in agent_model.expr
    assert "engineroom_model_requests_waiting_by_reason" in agent_model.expr
    at = {"node": "n1", "engine": "vllm-8000", "kind": "vllm", "model": "m"}
    nodes: dict[str, NodeReadings] = {}
    reader.read(
        agent_model,
        [
            sample("12.5", __name__="engineroom_model_generation_tokens_rate", **at),
            sample("0", __name__="engineroom_model_preemption_rate", **at),
            sample("0.25", __name__="engineroom_model_prefix_cache_hit_ratio", **at),
            sample(
                "2", __name__="engineroom_model_requests_waiting_by_reason", reason="capacity", **at
            ),
            sample(
                "7.5",
                __name__="engineroom_engine_api_server_cpu_percent",
                node="n1",
                engine="vllm-8000",
                kind="vllm",
            ),
        ],
        nodes,
    )
    snap = reader.snapshot("n1", nodes["n1"], time.time())
    [engine] = snap.engines
    [model] = engine.models
    assert engine.api_server_cpu_pct == 7.5
    assert [m.name for m in engine.models] == ["m"]
    assert (model.generation_tokens_rate, model.preemption_rate) == (12.5, 0.0)
    assert model.prefix_cache_hit_rate == 0.25
    assert model.requests_waiting_by_reason == {"capacity": 2.0}


def test_a_prometheus_without_the_series_leaves_them_unknown():
    """vLLM up to 0.12, or an exporter that drops these series: unknown, never 0."""
    reader, queries = reader_and_queries()
    snap = read_vllm(reader, queries, [sample("1", __name__="vllm:num_requests_running", **AT)])
    [engine] = snap.engines
    [model] = engine.models
    assert engine.api_server_cpu_pct is None
    assert model.generation_tokens_rate is None and model.preemption_rate is None
    assert model.prefix_cache_hit_rate is None and model.requests_waiting_by_reason is None


# -- check --json --------------------------------------------------------------------------


def test_check_json_gives_the_figures_per_deployment_and_the_cpu_per_engine():
    from console.collect.sources.collector import NodeState
    from console.collect.views.check import to_dict
    from console.collect.views.view import build
    from console.core.snapshot import decode_snapshot

    fleet = parse_fleet(prometheus_fleet(weight=100))
    model = ModelStats(
        name="m",
        generation_tokens_rate=12.5,
        preemption_rate=0.5,
        prefix_cache_hit_rate=0.25,
        requests_waiting_by_reason={"capacity": 3.0},
    )
    wire = snapshot_with(model, 41.5)
    wire.engines[0].endpoint = "http://10.0.0.1:8000"
    wire.engines[0].deployment_ids = ["m-vllm"]
    wire.node.time = time.time()
    snap = decode_snapshot(wire.model_dump_json())
    states = {"n1": NodeState("n1", "agent", snapshot=snap, last_ok=time.monotonic())}
    out = to_dict(build(fleet, states, 1.0), states)
    [engine] = out["nodes"][0]["engines"]
    assert engine["api_server_cpu_pct"] == 41.5
    [dep] = out["models"][0]["deployments"]
    assert dep["generation_tokens_rate"] == 12.5
    assert dep["preemption_rate"] == 0.5
    assert dep["prefix_cache_hit_rate"] == 0.25
    assert dep["requests_waiting_by_reason"] == {"capacity": 3.0}
    json.dumps(out)  # plain JSON
