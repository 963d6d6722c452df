"""Each model's capacity in a rollout's record, as a real gateway answers it (issue 31): how
many of its deployments are ready and in rotation now against what the plan keeps, read
from the route table at each read and never stored; unknown is unknown, never 0.

Two models in one restart plan, no engine behind either: tiny's two endpoints are closed
ports (its first step halts at tiny-a's drain, as tests/test_rollout_refusals.py shows),
and big has two deployments whose health checks pass (a small HTTP server here that
answers nothing else, so big-a's drain halts at its canary through big-b, before any
weight moved), one that is down and one with no weight. `engineroom rollout show` says
the same."""

from __future__ import annotations

import contextlib
import http.server
import json
import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.core.config.load import parse_fleet
from console.core.rollouts.plan_file import to_data
from console.core.rollouts.planner import Ask, make_plan
from tests.conftest import agent_env, run_cli
from tests.engines.servers import free_port, stop, wait_until
from tests.support.fleet import deployment, gateway_fleet
from tests.test_gateway import ADMIN, Gateway, start_gateway


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def healthy() -> Iterator[str]:
    """An endpoint whose /health answers 200 (all a gateway's health check reads)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def fleet_text(tmp_path: Path, gw_port: int, healthy: str, with_big: bool = True) -> str:
    """tiny: two deployments on closed ports; big: three that carry traffic (a, b healthy,
    c on a closed port) and an idle healthy one."""
    up = int(healthy.rsplit(":", 1)[1])
    models = {"tiny": [deployment(f"tiny-{x}", "local", "vllm", free_port(), weight=50)
                       for x in "ab"]}  # fmt: skip
    if with_big:
        models["big"] = [
            deployment("big-a", "local", "vllm", up, weight=50),
            deployment("big-b", "local", "vllm", up, weight=50),
            deployment("big-c", "local", "vllm", free_port(), weight=50),
            deployment("big-idle", "local", "vllm", up, weight=0),
        ]
    return gateway_fleet(
        "cap", gw_port, tmp_path / "gw-state", models, agent=f"http://127.0.0.1:{free_port()}",
        model={"failover": {"steps": [100], "verify_s": 0.5, "warmup_requests": 0,
                            "drain_timeout_s": 5}},
    )  # fmt: skip


def stored_result(tmp_path: Path, rid: str) -> dict:
    """The rollout's record as the gateway stored it (its SQLite job row)."""
    with contextlib.closing(sqlite3.connect(tmp_path / "gw-state" / "gateway.sqlite")) as db:
        (result,) = db.execute("SELECT result FROM jobs WHERE id = ?", (rid,)).fetchone()
    stored = json.loads(result)
    assert stored["steps"], stored  # the record it is, not an empty row
    return stored


def capacity(gateway: Gateway, rid: str) -> dict:
    return gateway.admin("GET", f"/admin/rollouts/{rid}").json()["capacity"]


def test_a_rollout_says_each_models_capacity_now_against_what_the_plan_keeps(
    tmp_path: Path, healthy: str
):
    port = free_port()
    text = fleet_text(tmp_path, port, healthy)
    plan = to_data(make_plan(parse_fleet(text), Ask(operation="restart", models=["tiny", "big"])))
    assert plan["max_unavailable"] == 1
    gateway = start_gateway(tmp_path, text, port, healthy=False)
    try:
        started = gateway.admin("POST", "/admin/rollouts",
                                json={"plan": plan, "who": "alice", "why": "kernel"})  # fmt: skip
        assert started.status_code == 202, started.text
        rid = started.json()["id"]
        assert set(started.json()["capacity"]) == {"tiny", "big"}  # with the answer too
        wait_until(lambda: gateway.admin("GET", f"/admin/rollouts/{rid}").json()["status"]
                   == "halted", 20, what="the rollout halted at tiny-a's drain")  # fmt: skip

        # big: a and b up with weight; c down; the idle one has no weight. Three carry its
        # traffic in fleet.toml, one may be out: the plan keeps 2.
        big = wait_until(lambda: (c := capacity(gateway, rid)["big"])["ready"] == 2 and c,
                         20, what="big's health checks")  # fmt: skip
        assert big == {"ready": 2, "deployments": 4, "keeps": 2, "max_unavailable": 1,
                       "unknown": None}, big  # fmt: skip
        # tiny: both checked and down, which is known: 0, below the 1 the plan keeps.
        tiny = wait_until(lambda: (c := capacity(gateway, rid)["tiny"])["ready"] == 0 and c,
                          20, what="tiny's health checks")  # fmt: skip
        assert tiny == {"ready": 0, "deployments": 2, "keeps": 1, "max_unavailable": 1,
                        "unknown": None}, tiny  # fmt: skip
        # Listed with it too; worked out at the read, never stored in the gateway's record.
        assert gateway.admin("GET", "/admin/rollouts").json()[0]["capacity"]["big"] == big
        assert "capacity" not in stored_result(tmp_path, rid)

        env = agent_env(ENGINEROOM_ADMIN_TOKEN=ADMIN)
        shown = run_cli("rollout", "show", rid, "--fleet", str(gateway.fleet), env=env)
        assert shown.returncode == 0, shown.stderr
        said = shown.stdout.splitlines()
        at = said.index("  capacity now (the plan takes 1 out at most per model)")
        assert said[at + 1 : at + 3] == [
            "    big: 2 of 4 ready and in rotation, the plan keeps 2",
            "    tiny: 0 of 2 ready and in rotation, the plan keeps 1: below it",
        ], shown.stdout

        aborted = gateway.admin("POST", f"/admin/rollouts/{rid}/abort",
                                json={"who": "bob", "why": "big moves"})  # fmt: skip
        assert aborted.status_code == 200, aborted.text
        assert aborted.json()["capacity"]["tiny"]["ready"] == 0  # with the answer too

        # big leaves the fleet file: its capacity is unknown now, and said why, never 0.
        gateway.fleet.write_text(fleet_text(tmp_path, port, healthy, with_big=False))
        gateway.process.send_signal(signal.SIGHUP)
        big = wait_until(lambda: (c := capacity(gateway, rid)["big"])["ready"] is None and c,
                         10, what="big gone from the gateway's routes")  # fmt: skip
        assert big["unknown"] == "big is not in the gateway's fleet file now", big
        assert big["deployments"] is None and big["keeps"] is None
        assert "capacity" not in stored_result(tmp_path, rid)
    finally:
        stop(gateway.process, grace=5)
