"""The incident playbook's plan, without Textual: a real fleet file, snapshots as real
agents print them (tests/fixtures/snapshot-cpu-drills.json, recorded by the agent of
tests/test_drills.py, and its shape with other engines, jobs and engine states for the
sequence), the console's own fleet view over them, the gateway's live weights as its
admin snapshot reports them and its failover jobs as GET /admin/jobs answers them.

The sequence is the on-call's: a stale engine detected, a standby started, the traffic
failed over to vLLM, the drill run, the traffic failed back. At each point every step
says the truth and names the deployment it acts on (issue 28, defect 6).
"""

from __future__ import annotations

import json
import time
from typing import Any

from console.collect.moves.playbook import Check, plan
from console.collect.recordings.replay import ReplayCollector
from console.collect.views import view as fleet_view
from console.collect.views.gateway_view import parse
from console.collect.views.operator_actions import gateway_job
from console.core.config.load import Fleet, parse_fleet
from console.core.snapshot import decode_snapshot
from tests.support.fleet import deployment, fleet_model, fleet_toml, vllm_profile
from tests.tui_support import FLEET, ROOT

DRILLS = ROOT / "tests" / "fixtures" / "snapshot-cpu-drills.json"
DRILL_FLEET = FLEET + '\n[drills.tiny-bf16]\nmodel = "tiny"\ndeployment = "tiny-trt"\n'
DRILL_FLEET += 'checkpoint = "/models/tiny"\n'


def playbook(fleet: Fleet, gateway: dict | None = None, model: str = "tiny"):
    recorded = decode_snapshot(DRILLS.read_text())
    collector = ReplayCollector(fleet, {"h200": None, "cpu-1": recorded, "gone": None})
    view = fleet_view.build(fleet, collector.states, fleet.fleet.refresh_s)
    return plan(fleet, model, view, collector.states, parse(gateway))


def test_a_stale_trt_engine_with_a_ready_standby_says_where_the_traffic_is_not_known():
    """No [gateway]: nothing moves the traffic and its weights are unknown, so the steps
    that need them say so; they are neither done nor next (never green when blind)."""
    checks = playbook(parse_fleet(DRILL_FLEET))
    assert [(c.name, c.state, c.action) for c in checks] == [
        ("TensorRT-LLM deployment", "failed", None),
        ("vLLM standby", "done", None),
        ("fail over to vLLM", "blocked", None),
        ("rebuild drill", "waiting", None),
        ("fail back to TensorRT-LLM", "waiting", None),
    ]
    assert "REBUILD REQUIRED: " in checks[0].detail
    assert "driver 580.159.04 → 575.57.08" in checks[0].detail
    assert checks[2].detail == "no [gateway] in fleet.toml: nothing moves the traffic"


def test_once_the_gateway_moved_the_traffic_the_drill_is_next_even_after_a_passed_run():
    """The recorded drills succeeded, but the engine is stale again: rebuild once more."""
    moved = {"models": {"tiny": {"tiny-trt": {"weight": 0}, "tiny-vllm": {"weight": 100}}}}
    checks = playbook(parse_fleet(GW_FLEET), moved)
    states = {c.name: (c.state, c.action) for c in checks}
    assert states["fail over to vLLM"] == ("done", None)
    assert states["rebuild drill"] == ("next", "run_drill")
    assert checks[3].detail.startswith("drill tiny-bf16: last succeeded (")
    assert checks[3].target == "tiny-trt"
    assert states["fail back to TensorRT-LLM"] == ("waiting", None)


def test_the_live_weights_win_over_the_declared_ones():
    """Declared: all on Triton. The gateway still says so: nothing moved."""
    same = {"models": {"tiny": {"tiny-trt": {"weight": 100}, "tiny-vllm": {"weight": 0}}}}
    checks = playbook(parse_fleet(GW_FLEET), same)
    assert checks[2].state == "next" and "tiny-trt still carries weight 100" in checks[2].detail
    # Declared all on vLLM, but the data plane has it all on Triton: still not moved.
    flipped = GW_FLEET.replace("weight = 100", "weight = 7").replace("weight = 0", "weight = 100")
    assert playbook(parse_fleet(flipped), same)[2].state == "next"


def test_a_gateway_not_read_yet_leaves_the_traffic_steps_unknown():
    checks = playbook(parse_fleet(GW_FLEET), None)
    assert checks[2].state == "blocked"
    assert checks[2].detail == "tiny-trt's live weight is unknown: the gateway has not answered yet"


def test_without_a_drill_for_the_deployment_the_drill_step_is_blocked():
    checks = playbook(parse_fleet(FLEET))
    assert (checks[3].state, checks[3].detail) == ("blocked", "no drill rebuilds tiny-trt")


def test_a_model_not_declared_or_without_both_engines_is_blocked_and_says_why():
    (unknown,) = playbook(parse_fleet(DRILL_FLEET), model="nope")
    assert (unknown.state, unknown.detail) == ("blocked", "nope is not declared in fleet.toml")
    only_trt = FLEET.replace('engine = "vllm"', 'engine = "triton"')
    (one,) = playbook(parse_fleet(only_trt))
    assert one.state == "blocked" and "a vLLM deployment" in one.detail


# -- the whole sequence, on the demo's layout ----------------------------------------------

GW_FLEET = DRILL_FLEET.replace(
    "[[nodes]]",
    '[gateway]\nurl = "http://127.0.0.1:9"\ntoken_env = "T_PLAYBOOK_ADMIN"\n\n[[nodes]]',
    1,
)

# The demo's llama: Triton on gpu-a1 (its engine goes stale), vLLM serving on gpu-a2,
# declared first, and the standby on gpu-a1 that a launch profile starts.
DEMO = fleet_toml(
    fleet={"name": "playbook", "refresh_s": 1.0},
    gateway={"url": "http://127.0.0.1:9", "token_env": "T_PLAYBOOK_ADMIN"},
    nodes=[{"name": "gpu-a1", "agent": "http://127.0.0.1:1"},
           {"name": "gpu-a2", "agent": "http://127.0.0.1:2"}],
    profiles={"llama8b-standby-a1": vllm_profile("gpu-a1", "/models/llama8b", 8011, None,
                                                 served="llama8b", args=None)},
    models=[fleet_model(
        "llama8b",
        deployment("llama8b-trt-a1", "gpu-a1", "triton", 8000, engine_model="ensemble",
                   weight=100),
        {"id": "llama8b-vllm-a2", "node": "gpu-a2", "engine": "vllm",
         "endpoint": "http://127.0.0.2:8001", "weight": 100},
        deployment("llama8b-vllm-a1", "gpu-a1", "vllm", 8011, weight=0,
                   profile="llama8b-standby-a1"),
    )],
    drills={"llama8b-bf16-a1": {"model": "llama8b", "deployment": "llama8b-trt-a1",
                                "checkpoint": "/models/llama8b"}},
)  # fmt: skip
TRT, SERVING, STANDBY = "llama8b-trt-a1", "llama8b-vllm-a2", "llama8b-vllm-a1"
RECORDED = json.loads(DRILLS.read_text())


def _engine(deployment: str, kind: str, port: int, state: str) -> dict[str, Any]:
    return {
        **RECORDED["engines"][1],
        "id": f"{kind}-{port}",
        "kind": kind,
        "endpoint": f"http://127.0.0.1:{port}",
        "state": state,
        "deployment_ids": [deployment],
        "models": [],
    }


def _job(job_id: str, kind: str, state: str, t: float, **params: str) -> dict[str, Any]:
    return {"id": job_id, "kind": kind, "state": state, "who": "alice", "created": t,
            "updated": t, "params": params, "steps": [], "result": {}}  # fmt: skip


class Incident:
    """The fleet at one point of the sequence; each method moves it on."""

    def __init__(self) -> None:
        self.fleet = parse_fleet(DEMO)
        self.t = time.time() - 600
        self.trt = "stale"
        self.standby: str | None = None  # the standby engine's state, once started
        self.agent_jobs: dict[str, dict[str, Any]] = {}
        self.failovers: dict[str, dict[str, Any]] = {}
        self.weights = {TRT: 100, SERVING: 100, STANDBY: 0}

    def tick(self) -> float:
        self.t += 10
        return self.t

    def checks(self) -> list[Check]:
        reasons = ["driver 570.133.20 → 580.95.05"] if self.trt == "stale" else []
        trt = {**RECORDED["trt_engines"][0], "deployment": TRT, "model": "llama8b",
               "state": self.trt, "reasons": reasons}  # fmt: skip
        a1 = [_engine(TRT, "triton", 8000, "ready")]
        if self.standby:
            a1.append(_engine(STANDBY, "vllm", 8011, self.standby))
        snaps = {
            "gpu-a1": {**RECORDED, "engines": a1, "trt_engines": [trt],
                       "jobs": list(self.agent_jobs.values())},
            "gpu-a2": {**RECORDED, "engines": [_engine(SERVING, "vllm", 8001, "ready")],
                       "trt_engines": [], "jobs": []},
        }  # fmt: skip
        for name, snap in snaps.items():
            snap["node"] = {**RECORDED["node"], "name": name, "time": time.time()}
        collector = ReplayCollector(
            self.fleet, {n: decode_snapshot(json.dumps(s)) for n, s in snaps.items()}
        )
        view = fleet_view.build(self.fleet, collector.states, 1.0)
        gateway = {"models": {"llama8b": {d: {"weight": w} for d, w in self.weights.items()}}}
        jobs = [j for raw in self.failovers.values() if (j := gateway_job(raw)) is not None]
        return plan(self.fleet, "llama8b", view, collector.states, parse(gateway), jobs)

    def agent_job(self, job_id: str, kind: str, state: str, **params: str) -> None:
        self.agent_jobs[job_id] = _job(job_id, kind, state, self.tick(), **params)

    def failover(self, job_id: str, to: str, state: str) -> None:
        job = _job(job_id, "failover.planned", state, self.tick(), model="llama8b", to=to)
        self.failovers[job_id] = {**job, "who": "admin", "params": {**job["params"],
                                  "mode": "planned", "why": "playbook"}}  # fmt: skip


def states(checks: list[Check]) -> list[tuple[str, str | None, str | None]]:
    return [(c.state, c.action, c.target) for c in checks]


def test_each_step_of_the_incident_says_the_truth_and_names_its_deployment():
    incident = Incident()
    # 1. A stale engine detected: start the standby, the deployment with the profile.
    checks = incident.checks()
    assert states(checks) == [
        ("failed", None, None),
        ("next", "start_standby", STANDBY),
        ("waiting", None, None),
        ("waiting", None, None),
        ("waiting", None, None),
    ]
    assert checks[1].detail == f"start {STANDBY} on gpu-a1 (profile llama8b-standby-a1)"

    # 2. The standby starting, then ready: step 2 names it, not the vLLM already serving.
    incident.agent_job("s1", "vllm.start", "running", profile="llama8b-standby-a1")
    incident.standby = "loading"
    checks = incident.checks()
    assert checks[1].state == "running" and checks[1].detail == f"job s1 is starting {STANDBY}"
    incident.agent_job("s1", "vllm.start", "succeeded", profile="llama8b-standby-a1")
    incident.standby = "ready"
    checks = incident.checks()
    assert (checks[1].state, checks[1].detail) == ("done", f"{STANDBY} is ready on gpu-a1")
    # Enter on step 3 opens the failover plan to the standby (vLLM), not to Triton.
    assert states(checks)[2] == ("next", "fail_over", STANDBY)
    assert checks[2].detail.startswith(f"{TRT} still carries weight 100")
    # ... and it drains the TensorRT-LLM deployment onto it: the other replicas keep
    # theirs (with traffic that follows the weights, "all to the standby" moved theirs too).
    assert checks[2].source == TRT and "drains it onto" in checks[2].detail
    assert [c.state for c in checks[3:]] == ["waiting", "waiting"]

    # 3. The failover running, then done: all of the model on the standby.
    incident.failover("f1", STANDBY, "running")
    incident.weights = {TRT: 50, SERVING: 0, STANDBY: 50}
    checks = incident.checks()
    assert (checks[2].state, checks[2].detail) == (
        "running",
        f"job f1 moves the traffic to {STANDBY}",
    )
    incident.failover("f1", STANDBY, "succeeded")
    incident.weights = {TRT: 0, SERVING: 0, STANDBY: 100}
    checks = incident.checks()
    # Weight 0 on the TensorRT-LLM deployment: the step is done, not "still has weight 0".
    assert checks[2].state == "done", checks[2].detail
    assert checks[2].detail == f"{STANDBY} carries the traffic; {TRT} has weight 0 (job f1)"
    assert "still" not in checks[2].detail
    assert checks[1].detail == f"{STANDBY} is ready on gpu-a1"
    assert states(checks)[3] == ("next", "run_drill", TRT)
    assert checks[4].state == "waiting"

    # 4. The drill running, then passed: the engine is current again.
    incident.agent_job("d1", "drill.run", "running", drill="llama8b-bf16-a1")
    checks = incident.checks()
    assert checks[3].state == "running" and "(d1)" in checks[3].detail
    incident.agent_job("d1", "drill.run", "succeeded", drill="llama8b-bf16-a1")
    incident.trt = "current"
    checks = incident.checks()
    assert [c.state for c in checks[:4]] == ["done", "done", "done", "done"]
    assert checks[1].detail == f"{STANDBY} is ready on gpu-a1"
    # Step 4 done: step 5 is next, not "waiting after the drill passes".
    assert states(checks)[4] == ("next", "fail_back", TRT)
    assert checks[4].detail == f"move the traffic back to {TRT}"

    # 5. The fail-back running, then done: every step done.
    incident.failover("f2", TRT, "running")
    assert incident.checks()[4].state == "running"
    incident.failover("f2", TRT, "succeeded")
    incident.weights = {TRT: 100, SERVING: 0, STANDBY: 0}
    checks = incident.checks()
    assert [c.state for c in checks] == ["done"] * 5, [c.detail for c in checks]
    assert checks[4].detail == f"{TRT} carries the traffic (weight 100)"
    assert checks[2].detail == f"done by job f1; {TRT} is current again (weight 100)"


def test_a_failed_try_is_said_and_the_step_stays_next():
    incident = Incident()
    incident.agent_job("s1", "vllm.start", "failed", profile="llama8b-standby-a1")
    incident.agent_jobs["s1"]["error"] = "load: the engine exited with code 1"
    checks = incident.checks()
    assert states(checks)[1] == ("next", "start_standby", STANDBY)
    assert checks[1].detail.endswith(
        "the last try, job s1, failed: load: the engine exited with code 1"
    )
    incident.standby = "ready"
    incident.failover("f1", STANDBY, "failed")  # rolled back: the weights are as before
    checks = incident.checks()
    assert states(checks)[2] == ("next", "fail_over", STANDBY)
    assert "the last try, job f1, failed" in checks[2].detail
    # The drill rebuilt the engine in place while it still served (seen in the demo): the
    # failover was not needed after all, and the failed job did not do it.
    incident.agent_job("d1", "drill.run", "succeeded", drill="llama8b-bf16-a1")
    incident.trt = "current"
    checks = incident.checks()
    assert checks[2].state == "done"
    assert checks[2].detail == (
        f"not needed: {TRT} is current (weight 100); the failover job f1 failed"
    )


def test_traffic_on_a_standby_that_is_not_ready_is_a_failure_not_done():
    incident = Incident()
    incident.weights = {TRT: 0, SERVING: 0, STANDBY: 100}
    checks = incident.checks()
    assert checks[1].state == "failed" and "carries weight 100" in checks[1].detail
