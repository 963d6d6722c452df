"""The agent's v1 API as an operator meets it: tokens, snapshot, metrics, schema."""

from __future__ import annotations

import json
from pathlib import Path

from console.core.wire import DrillResult, Snapshot
from tests.conftest import OPERATOR, agent_env, run_cli

FLEET = """\
[fleet]
name = "t"
[agent]
scrape_interval_s = 0.5
disk_paths = ["/tmp"]
[[nodes]]
name = "local"
agent = "http://127.0.0.1:9410"
"""


def test_tokens_guard_every_route_but_healthz(agent_factory):
    agent = agent_factory(FLEET)
    assert agent.get("/healthz", token=None).json() == {"status": "ok", "version": "0.1.0"}
    for path in ("/v1/snapshot", "/metrics", "/v1/jobs"):
        missing = agent.get(path, token=None)
        assert missing.status_code == 401, path
        assert missing.headers["www-authenticate"] == "Bearer"
        assert agent.get(path, token="wrong-token-123").status_code == 401, path
        assert agent.get(path).status_code == 200, path
        assert agent.get(path, token=OPERATOR.split(":", 1)[1]).status_code == 200, path


def test_a_viewer_token_cannot_act(agent_factory):
    import httpx

    agent = agent_factory(FLEET)
    body = {"kind": "vllm.start", "profile": "x"}
    viewer = httpx.post(
        agent.url + "/v1/jobs",
        json=body,
        timeout=5,
        headers={"Authorization": "Bearer viewer-token-0123"},
    )
    assert viewer.status_code == 403
    assert "viewer role" in viewer.json()["error"]
    operator = httpx.post(
        agent.url + "/v1/jobs",
        json=body,
        timeout=5,
        headers={"Authorization": f"Bearer {OPERATOR.split(':', 1)[1]}"},
    )
    assert operator.status_code == 404  # allowed to ask; this node has no profile "x"
    assert httpx.delete(agent.url + "/v1/jobs/x", timeout=5).status_code == 401


def test_tokens_never_reach_the_log(agent_factory):
    agent = agent_factory(FLEET)
    agent.get("/v1/snapshot")
    agent.get("/v1/snapshot", token="a-wrong-token-that-must-not-be-logged")
    text = agent.log.read_text()
    assert "viewer-token-0123" not in text
    assert "a-wrong-token-that-must-not-be-logged" not in text


def test_without_nvml_the_snapshot_says_why_and_the_rest_works(agent_factory):
    agent = agent_factory(FLEET)
    snap = agent.snapshot()
    assert snap["gpu_status"] == "no NVIDIA driver (NVML library not found)"
    assert snap["gpus"] == []
    assert snap["driver_version"] is None  # unknown is null, never 0
    assert snap["node"]["name"] == "local"
    assert snap["host"]["mem_total_bytes"] > 0
    assert snap["host"]["disks"][0]["path"] == "/tmp"
    assert snap["host"]["disks"][0]["total_bytes"] > 0
    metrics = agent.get("/metrics").text
    assert 'engineroom_nvml_up{node="local"} 0' in metrics


def test_the_snapshot_refreshes_on_its_interval(agent_factory):
    from tests.engines.servers import wait_until

    agent = agent_factory(FLEET)
    first = agent.snapshot()["node"]["time"]
    wait_until(
        lambda: agent.snapshot()["node"]["time"] > first, timeout=10, what="a newer snapshot"
    )


def test_the_agent_publishes_an_openapi_schema_with_the_snapshot_model(agent_factory):
    agent = agent_factory(FLEET)
    assert agent.get("/openapi.json", token=None).status_code == 401  # a viewer token reads it
    schema = agent.get("/openapi.json").json()
    assert "/v1/snapshot" in schema["paths"]
    assert {"Snapshot", "Gpu", "Engine", "ModelStats"} <= set(schema["components"]["schemas"])


def test_an_agent_without_tokens_refuses_to_start(tmp_path):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    env = {k: v for k, v in agent_env().items() if "TOKEN" not in k}
    result = run_cli(
        "agent", "--fleet", str(fleet), "--node", "local", "--listen", "127.0.0.1:1", env=env
    )
    assert result.returncode == 3
    assert (
        "no tokens: set ENGINEROOM_VIEWER_TOKEN and/or ENGINEROOM_OPERATOR_TOKEN" in result.stderr
    )


def test_once_json_prints_one_snapshot_for_agentless_use(tmp_path):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    result = run_cli(
        "agent", "--fleet", str(fleet), "--node", "local", "--once", "--json", env=agent_env()
    )
    assert result.returncode == 0, result.stderr
    snap = json.loads(result.stdout)
    assert set(snap) >= {
        "node",
        "host",
        "gpu_status",
        "driver_version",
        "cuda_driver_version",
        "gpus",
        "engines",
        "jobs",
    }
    assert snap["host"]["cpu_pct"] is not None


def test_recorded_drill_results_read_as_the_wire_models():
    """The typed result models (console.core.wire) describe what a real drill recorded
    (tests/fixtures/snapshot-cpu-drills.json, printed by tests/test_drills.py's agent)."""
    fixture = Path(__file__).parent / "fixtures" / "snapshot-cpu-drills.json"
    snapshot = Snapshot.model_validate_json(fixture.read_text())
    drills = [j for j in snapshot.jobs if j.kind == "drill.run"]
    assert drills
    for job in drills:
        result = DrillResult.model_validate(job.result)
        assert result.gates and all(g.ok for g in result.gates), result.gates
        assert result.cache in ("hit", "miss") and result.build_key
        assert result.validate_ is not None and result.benchmark is not None
        assert result.versions and result.time_to_rebuild_s is not None
