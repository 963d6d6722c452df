"""What a rollout run refuses, through a real gateway process and the real command line,
with no engine behind it (the deployments' endpoints and the agent's URL are closed ports):
each refusal says what and where, and no rollout starts. A rollout whose first step cannot
drain halts with why, and is aborted with who and why."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.conftest import agent_env, run_cli
from tests.engines.servers import free_port, stop, wait_until
from tests.support.fleet import deployment, gateway_fleet
from tests.test_gateway import ADMIN, GATEWAY_VIEWER, Gateway, start_gateway

TOKEN_ENV = "T_ROLL_AGENT"


def fleet_text(gw_port: int, state: Path, models: tuple[str, ...] = ("tiny",)) -> str:
    """Each model: two deployments (NAME-a, NAME-b) on closed ports; the agent closed too."""
    deps = {m: [deployment(f"{m}-{x}", "local", "vllm", free_port()) for x in "ab"] for m in models}
    return gateway_fleet(
        "roll", gw_port, state, deps, agent=f"http://127.0.0.1:{free_port()}", token_env=TOKEN_ENV,
        model={"failover": {"steps": [100], "verify_s": 0.2, "warmup_requests": 1,
                            "drain_timeout_s": 5}},
    )  # fmt: skip


def run_halted(
    gateway: Gateway, plan: Path, why: str, fleet: str, env: dict
) -> tuple[str, str, dict]:
    """`engineroom rollout run PLAN --wait`, which exits 1: (what it printed, the rollout's
    id, its record, halted)."""
    run = run_cli("rollout", "run", str(plan), "--why", why, "--wait", "--fleet", fleet,
                  env=env, timeout=120)  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    rollout_id = run.stdout.split()[1]
    record = gateway.admin("GET", f"/admin/rollouts/{rollout_id}").json()
    assert record["status"] == "halted", record
    return run.stdout, rollout_id, record


def post(gateway: Gateway, body: object, token: str = ADMIN):
    import httpx

    return httpx.post(gateway.url + "/admin/rollouts", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {token}"})  # fmt: skip


def test_a_rollout_that_cannot_run_is_refused_and_one_that_cannot_drain_halts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    port = free_port()
    (tmp_path / "fleet.toml").write_text(fleet_text(port, tmp_path / "gw"))
    fleet = str(tmp_path / "fleet.toml")
    env = agent_env(ENGINEROOM_ADMIN_TOKEN=ADMIN)
    made = run_cli("rollout", "plan", "--restart", "--model", "tiny", "--json", "--fleet", fleet,
                   env=env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    plan = json.loads(made.stdout)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    gateway = start_gateway(tmp_path, "", port, healthy=False)
    try:
        # The agent's token is not in the gateway's environment: it could not act.
        refused = post(gateway, {"plan": plan, "who": "alice", "why": "fix"})
        assert refused.status_code == 422, refused.text
        assert TOKEN_ENV in refused.json()["error"] and "local" in refused.json()["error"]
        # Not a plan; a plan edited out of shape; the wrong body: each said, with where.
        refused = post(gateway, {"plan": {**plan, "version": 2}})
        assert refused.status_code == 422 and "version 2" in refused.json()["error"]
        edited = json.loads(json.dumps(plan))
        edited["waves"][1]["steps"][0]["deployment"] = "tiny-z"
        refused = post(gateway, {"plan": edited})
        assert refused.status_code == 422, refused.text
        assert (
            "waves[1].steps[0]: deployment 'tiny-z' is not in the fleet file"
            in (refused.json()["error"])
        )
        refused = post(gateway, {"plan": plan, "who": 7})
        assert refused.status_code == 422 and "who" in refused.json()["error"]
        # A viewer token reads rollouts and starts none.
        assert post(gateway, {"plan": plan}, GATEWAY_VIEWER).status_code == 403
        assert gateway.admin("GET", "/admin/rollouts").json() == []  # nothing started
        # The command line holds the plan file to the fleet before it asks the gateway.
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(edited))
        out = run_cli("rollout", "run", str(bad), "--fleet", fleet, env=env)
        assert out.returncode == 1 and "nothing started" in out.stderr, out.stderr
        assert "tiny-z" in out.stderr
        out = run_cli("rollout", "show", "../routes", "--fleet", fleet, env=env)
        assert out.returncode == 2 and "is not a rollout id" in out.stderr, out.stderr
        out = run_cli("rollout", "abort", "0123456789ab", "--fleet", fleet, env=env)
        assert out.returncode == 1 and "no rollout '0123456789ab'" in out.stderr, out.stderr
    finally:
        stop(gateway.process, grace=5)

    # With the token: it starts, and its first step cannot drain (nothing answers).
    monkeypatch.setenv(TOKEN_ENV, "agent-token-0123456789")
    gateway = start_gateway(tmp_path, "", port, healthy=False)
    try:
        good = tmp_path / "plan.json"
        good.write_text(json.dumps(plan))
        said, rollout_id, record = run_halted(gateway, good, "drill night", fleet, env)
        assert record["steps"][0]["state"] == "halted" and record["steps"][1]["state"] == "pending"
        assert record["error"].startswith("step 1 (tiny-a): drain: no other deployment of tiny "
                                          "is ready"), record["error"]  # fmt: skip
        assert "last ready deployment stays in rotation" in record["error"]
        assert "halted" in said and record["error"] in " ".join(said.split())
        again = post(gateway, {"plan": plan})
        assert again.status_code == 409 and rollout_id in again.json()["error"]
        assert gateway.admin("POST", f"/admin/rollouts/{rollout_id}/pause",
                             json={}).status_code == 409  # fmt: skip
        out = run_cli("rollout", "abort", rollout_id, "--why", "engines are gone",
                      "--fleet", fleet, env=env)  # fmt: skip
        assert out.returncode == 0, out.stderr
        record = gateway.admin("GET", f"/admin/rollouts/{rollout_id}").json()
        assert record["status"] == "aborted" and "engines are gone" in record["error"]
        assert record["steps"][0]["state"] == "aborted"
        audit = gateway.admin("GET", "/admin/audit").json()
        assert [r["params"]["why"] for r in audit if r["action"] == "rollout aborted"] == [
            "engines are gone"
        ]
        ended = gateway.admin("POST", f"/admin/rollouts/{rollout_id}/resume", json={})
        assert ended.status_code == 409 and "has ended (aborted)" in ended.json()["error"]
        wait_until(lambda: gateway.admin("GET", "/admin/rollouts").json()[0]["status"]
                   == "aborted", 5, what="listed aborted")  # fmt: skip
    finally:
        stop(gateway.process, grace=5)


def test_a_waves_models_step_side_by_side_and_each_halt_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two models, each with two deployments: the canary wave holds one of each. Both
    steps run at once; neither can drain (nothing answers), so both halt before the
    rollout does, and the second wave never starts. (Run one after another, the first
    halt would have left the other model's canary pending.)"""
    port = free_port()
    (tmp_path / "fleet.toml").write_text(fleet_text(port, tmp_path / "gw", ("tiny", "small")))
    fleet = str(tmp_path / "fleet.toml")
    env = agent_env(ENGINEROOM_ADMIN_TOKEN=ADMIN)
    plan = tmp_path / "plan.json"
    made = run_cli("rollout", "plan", "--restart", "--model", "tiny", "--model", "small",
                   "--out", str(plan), "--fleet", fleet, env=env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    waves = [[s["deployment"] for s in w["steps"]] for w in json.loads(plan.read_text())["waves"]]
    assert waves == [["tiny-a", "small-a"], ["tiny-b", "small-b"]], waves
    monkeypatch.setenv(TOKEN_ENV, "agent-token-0123456789")
    gateway = start_gateway(tmp_path, "", port, healthy=False)
    try:
        _, rollout_id, record = run_halted(gateway, plan, "both at once", fleet, env)
        assert [(s["deployment"], s["state"]) for s in record["steps"]] == [
            ("tiny-a", "halted"), ("small-a", "halted"), ("tiny-b", "pending"),
            ("small-b", "pending"),
        ]  # fmt: skip
        assert record["current"] == 0
        assert record["error"].startswith("step 1 (tiny-a): drain: "), record["error"]
        assert record["error"].endswith("(and 1 more step(s) of this wave halted)")
        # small leaves the fleet file (the gateway reloads it on SIGHUP); the abort still
        # ends the rollout, small's weights said unknown, with why.
        (tmp_path / "fleet.toml").write_text(fleet_text(port, tmp_path / "gw", ("tiny",)))
        gateway.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "small" not in gateway.admin("GET", "/admin/routes").json(), 10,
                   what="small gone from the gateway's routes")  # fmt: skip
        aborted = gateway.admin("POST", f"/admin/rollouts/{rollout_id}/abort",
                                json={"who": "bob", "why": "engines are gone"})  # fmt: skip
        assert aborted.status_code == 200, aborted.text
        record = aborted.json()
        assert [s["state"] for s in record["steps"]] == ["aborted", "aborted", "pending", "pending"]
        assert "tiny-a was in phase drain; tiny's weights now: {" in record["error"]
        assert ("small-a was in phase drain; small's weights now: unknown: the model is no "
                "longer in the gateway's fleet file") in record["error"]  # fmt: skip
    finally:
        stop(gateway.process, grace=5)
