"""`check` says one honest SLO verdict per deployment, on the demo fleet (issue 28, #13).

Real agents and a real gateway over SIMULATED engines (`python -m console.sim`). `check`
marked the Triton deployments SLO-ok from a windowed mean (their p95 is null in the
JSON), and judged a deployment ok at 640 ms through the gateway against a 500 ms SLO.
Now: a mean is never a p95 (unknown, never ok), and where the gateway measured a
deployment its p95 is what is judged (console/core/slo.py); the verdict over built inputs
is in tests/test_alerts.py, the rules' in tests/test_rules.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import agent_env, run_cli
from tests.engines.servers import wait_until
from tests.sim.conftest import TOKEN, SimFleet, end, start_sim

ENV = agent_env(ENGINEROOM_DEMO_TOKEN=TOKEN)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    sim = start_sim(tmp_path_factory.mktemp("demo"), "--nodes", "2")
    yield sim
    end(sim)


def deployments(report: dict) -> list[dict]:
    return [d for m in report["models"] for d in m["deployments"]]


def check(fleet: Path) -> dict:
    result = run_cli("check", "--fleet", str(fleet), "--json", env=ENV)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def without_gateway(fleet: Path, tmp_path: Path) -> Path:
    """The demo's fleet file less its [gateway]: the engines' own figures only."""
    text = re.sub(r"\n\[gateway\]\n(?:[^\[\n][^\n]*\n|\n)*", "\n", fleet.read_text())
    assert "[gateway]" not in text
    out = tmp_path / "fleet.toml"
    out.write_text(text)
    return out


def test_a_triton_mean_is_never_judged_ok(demo, tmp_path):
    fleet = without_gateway(demo.fleet, tmp_path)

    def means() -> list[dict] | None:
        found = [
            d
            for d in deployments(check(fleet))
            if d["engine"] == "triton"
            and d["latency"]
            and d["latency"]["ttft_s"]["p95"] is None
            and d["latency"]["ttft_s"]["mean"] is not None
        ]
        return found or None

    found = wait_until(means, 60, interval=1.0, what="Triton deployments with a TTFT mean")
    for d in found:
        assert d["slo"]["ttft"] == "unknown", d["id"]
        assert d["slo_ok"] is not True, d["id"]
        ttft = d["slo_verdict"]["figures"]["ttft"]
        assert ttft["value"] is None and ttft["why_unknown"] == "mean only"
        assert ttft["mean"] == d["latency"]["ttft_s"]["mean"]
    text = run_cli("check", "--fleet", str(fleet), env=ENV).stdout
    ids = {d["id"] for d in found}
    lines = [line for line in text.splitlines() if line.split()[:1] and line.split()[0] in ids]
    assert lines and all("? mean only" in line for line in lines), lines
    assert all(" ok" not in line.split("?")[-1] for line in lines)


def test_where_the_gateway_measured_a_deployment_its_p95_is_judged(demo):
    def judged() -> dict | None:
        report = check(demo.fleet)
        found = [
            d
            for d in deployments(report)
            if d["gateway_latency"] and d["gateway_latency"]["ttft_s"]["p95"] is not None
        ]
        return report if len(found) >= 4 else None

    report = wait_until(judged, 90, interval=1.0, what="deployments the gateway measured")
    for d in deployments(report):
        gateway = (d["gateway_latency"] or {}).get("ttft_s", {}).get("p95")
        ttft = d["slo_verdict"]["figures"]["ttft"]
        if gateway is None:
            assert ttft["measured_at"] in (None, "engine"), d["id"]
            continue
        assert (ttft["measured_at"], ttft["value"]) == ("gateway", gateway), d["id"]
        if ttft["limit"] is None:
            continue
        over = gateway > ttft["limit"]
        assert d["slo"]["ttft"] == ("breach" if over else "ok"), (d["id"], gateway)
        if over:
            assert d["slo_ok"] is False
            level = "critical" if gateway > 2 * ttft["limit"] else "warning"
            assert d["slo_verdict"]["level"] in ("warning", "critical")
            assert ttft["level"] == level
