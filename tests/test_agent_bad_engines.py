"""A hung, lying or broken engine costs the agent one bounded timeout and a clear state."""

from __future__ import annotations

import time

import psutil

from tests.engines.servers import free_port, wait_until
from tests.support.fleet import deployment, fleet_model, one_node_fleet


def fleet_for(ports: dict[str, int], refused: int, timeout: float = 1.0) -> str:
    """Model m: a vLLM deployment per engine double's mode (named after it) and one on the
    `refused` port, and a Triton one on the hung double."""
    hung = f"http://127.0.0.1:{ports['hang']}"
    return one_node_fleet(
        "t",
        fleet_model(
            "m",
            *(deployment(mode, "local", "vllm", port)
              for mode, port in {**ports, "refused": refused}.items()),
            {"id": "triton-hung", "node": "local", "engine": "triton", "endpoint": hung,
             "metrics_endpoint": hung},
        ),
        agent={"scrape_interval_s": 1.0, "probe_timeout_s": timeout,
               "max_response_bytes": 1048576, "discover": False},
    )  # fmt: skip


def test_each_bad_engine_gets_a_state_and_a_reason(agent_factory, hostile_engines):
    refused = free_port()  # nothing listens here
    agent = agent_factory(fleet_for(hostile_engines, refused))
    ports = hostile_engines

    def engines() -> dict[str, dict]:
        snap = agent.snapshot()
        return {e["deployment_ids"][0]: e for e in snap["engines"]}

    by_id = wait_until(
        lambda: (e := engines()) and len(e) == 6 and e,
        timeout=20,
        what="all six engines in the snapshot",
    )
    assert by_id["hang"]["state"] == "unhealthy"
    assert by_id["hang"]["reason"] == "/health: no answer within 1 s"
    assert by_id["triton-hung"]["state"] == "unhealthy"
    assert "no answer within 1 s" in by_id["triton-hung"]["reason"]
    assert by_id["error500"]["state"] == "unhealthy"
    assert "/health answered 500" in by_id["error500"]["reason"]
    assert by_id["refused"]["state"] == "down"
    assert by_id["refused"]["reason"] == "/health: connection refused"

    garbage = by_id["garbage"]
    assert garbage["state"] == "ready"  # it serves; only its metrics are unreadable
    assert "/metrics: no readable Prometheus sample" in garbage["reason"]
    assert garbage["version"] == "0.32.0"
    assert garbage["models"][0]["name"] == "m"
    assert garbage["models"][0]["requests_running"] is None  # unknown, not 0

    enormous = by_id["enormous"]
    assert "/metrics: response too large (over 1048576 bytes)" in enormous["reason"]
    assert enormous["models"][0]["requests_running"] is None
    for engine in by_id.values():
        assert engine["probe_ms"] < 3500, engine  # at most the 3x1 s probe bound

    assert ports  # the hostile servers stayed up throughout


def test_the_agent_answers_at_once_while_engines_hang(agent_factory, hostile_engines):
    # Probes hang for 3 s each; an API that waited on them would stall that long.
    agent = agent_factory(fleet_for(hostile_engines, free_port(), timeout=3.0))
    worst = 0.0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # several cycles, each with hung probes in flight
        started = time.monotonic()
        assert agent.get("/v1/snapshot", timeout=5).status_code == 200
        assert agent.get("/healthz", token=None, timeout=5).status_code == 200
        worst = max(worst, time.monotonic() - started)
    assert worst < 1.5, f"the API stalled for {worst:.2f} s behind hung engines"
    snap = agent.snapshot()
    assert snap["cycle"]["wall_ms"] < 3 * 3000 + 1000  # bounded by the probe deadline
    rss = psutil.Process(agent.process.pid).memory_info().rss
    assert rss < 400 * 2**20, f"agent RSS {rss / 2**20:.0f} MiB after an enormous response"
