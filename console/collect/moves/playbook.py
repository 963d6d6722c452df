"""The incident playbook's plan for one model (no Textual here): a checklist over the
existing jobs for a stale or broken TensorRT-LLM deployment.

Start a vLLM standby, fail over to it, run the rebuild drill, fail back once it passed.
Each step's state comes from what is so now, never from what fleet.toml declares: the
fleet view (which engine is ready, which TensorRT-LLM engine is stale), the weights the
gateway's data plane really has (its snapshot), the agents' jobs in their snapshots (the
standby's start, the drill) and the gateway's failover jobs. Where the weights are not
known the steps that need them say so; they are never taken as done. The Playbook screen
draws the checks and does the step marked next, on the deployment the step names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from console.collect.sources.collector import NodeState
from console.collect.views.gateway_view import GatewayView
from console.collect.views.view import DeploymentRow, FleetView
from console.core.config.load import Deployment, Fleet
from console.core.snapshot import Job

OPEN = ("queued", "running")


@dataclass
class Check:
    name: str
    state: str  # done | next | waiting | running | failed | blocked
    detail: str
    action: str | None = None  # what Enter does when this is the next step
    target: str | None = None  # the deployment the action acts on
    source: str | None = None  # a failover's: the deployment whose traffic moves off


def drill_rebuilding(fleet: Fleet, deployment: str) -> str | None:
    """The drill that rebuilds `deployment`, by name; None if no drill does."""
    return next((n for n, d in fleet.drills.items() if d.deployment == deployment), None)


def plan(
    fleet: Fleet,
    model_name: str,
    view: FleetView,
    states: Mapping[str, NodeState],
    gateway: GatewayView | None,
    gateway_jobs: Sequence[Job] = (),
    gateway_error: str | None = None,
) -> list[Check]:
    """The playbook's checks for `model_name`, in order; the first `next` one with an
    action is what the operator can do now."""
    model = next((m for m in fleet.models if m.name == model_name), None)
    if model is None:
        return [Check("model", "blocked", f"{model_name} is not declared in fleet.toml")]
    rows = {r.id: r for r in view.models.get(model_name, []) if r.id}
    trt = [d for d in model.deployments if d.engine in ("triton", "trtllm")]
    vllm = [d for d in model.deployments if d.engine == "vllm"]
    if not trt or not vllm:
        return [
            Check(
                "deployments",
                "blocked",
                "the playbook needs a TensorRT-LLM (triton or trtllm) and a vLLM deployment",
            )
        ]
    source = _source(fleet, trt, rows)
    failovers = sorted(
        (j for j in gateway_jobs if j.params.get("model") == model_name),
        key=lambda j: j.created or 0,
    )
    vllm_ids = {d.id for d in vllm}
    to_vllm = next((j for j in reversed(failovers) if j.params.get("to") in vllm_ids), None)
    to_source = next((j for j in reversed(failovers) if j.params.get("to") == source.id), None)
    standby = _standby(source, vllm, to_vllm)
    src_row, sb_row = rows.get(source.id), rows.get(standby.id)
    stale = src_row is not None and src_row.trt is not None and src_row.trt.state == "stale"
    src_ready = src_row is not None and src_row.state == "ready"
    sb_ready = sb_row is not None and sb_row.state == "ready"
    weights = gateway.weights(model_name) if gateway is not None else None
    w_src = None if weights is None else weights.get(source.id)
    carriers = [d for d, w in (weights or {}).items() if d != source.id and w > 0]
    moved = w_src == 0 and bool(carriers)  # off the source, and served elsewhere
    serving = f"{', '.join(carriers)} {'carries' if len(carriers) == 1 else 'carry'} the traffic"
    drill = drill_rebuilding(fleet, source.id)
    last_drill = _last_job(states, "drill.run", "drill", drill) if drill else None
    passed = last_drill is not None and last_drill.state == "succeeded"
    current = src_row is not None and src_row.trt is not None and src_row.trt.state == "current"
    rebuilt = src_row is not None and not stale and (passed or current)
    resolved = rebuilt and bool(w_src) and src_ready  # back on a current, ready engine
    if fleet.gateway is None:
        unknown = "no [gateway] in fleet.toml: nothing moves the traffic"
    else:
        unknown = f"{source.id}'s live weight is unknown: " + (
            gateway_error or "the gateway has not answered yet"
        )

    checks: list[Check] = []
    # 1. the TensorRT-LLM deployment
    why = []
    if stale and src_row is not None and src_row.trt is not None:
        why.append("REBUILD REQUIRED: " + "; ".join(src_row.trt.reasons))
    if not src_ready:
        why.append(f"{source.id} is {src_row.state if src_row else 'not reporting'}")
    checks.append(
        Check(
            "TensorRT-LLM deployment",
            "failed" if why else "done",
            "; ".join(why) or f"{source.id} is ready and current",
        )
    )

    # 2. a vLLM standby
    last_start = (
        _last_job(states, "vllm.start", "profile", standby.profile) if standby.profile else None
    )
    sb_state = sb_row.state if sb_row else "not reporting"
    if sb_ready:
        step = Check("vLLM standby", "done", f"{standby.id} is ready on {standby.node}")
    elif last_start is not None and last_start.state in OPEN:
        step = Check("vLLM standby", "running", f"job {last_start.id} is starting {standby.id}")
    elif moved and standby.id in carriers:
        step = Check(
            "vLLM standby",
            "failed",
            f"{standby.id} carries weight {weights and weights[standby.id]} but is {sb_state}",
        )
    elif moved:
        step = Check("vLLM standby", "done", f"not needed: {serving}")
    elif resolved:
        step = Check("vLLM standby", "done", f"not needed now: {source.id} is back and current")
    elif standby.profile is None:
        step = Check(
            "vLLM standby",
            "blocked",
            f"{standby.id} is {sb_state} and has no launch profile (deployment.profile)",
        )
    else:
        step = Check(
            "vLLM standby",
            "next",
            f"start {standby.id} on {standby.node} (profile {standby.profile})"
            + _failed(last_start),
            "start_standby",
            standby.id,
        )
    checks.append(step)

    # 3. traffic on vLLM
    if fleet.gateway is None or w_src is None:
        step = Check("fail over to vLLM", "blocked", unknown)
    elif to_vllm is not None and to_vllm.state in OPEN:
        step = Check(
            "fail over to vLLM",
            "running",
            f"job {to_vllm.id} moves the traffic to {to_vllm.params.get('to')}",
        )
    elif moved:
        step = Check(
            "fail over to vLLM",
            "done",
            f"{serving}; {source.id} has weight 0"
            + (f" (job {to_vllm.id})" if to_vllm is not None else ""),
        )
    elif rebuilt:
        detail = f"not needed: {source.id} is current (weight {w_src})"
        if to_vllm is not None and to_vllm.state == "succeeded":
            detail = f"done by job {to_vllm.id}; {source.id} is current again (weight {w_src})"
        elif to_vllm is not None:  # rolled back or cancelled: it did not move the traffic
            detail += f"; the failover job {to_vllm.id} {to_vllm.state}"
        step = Check("fail over to vLLM", "done", detail)
    elif sb_ready:
        step = Check(
            "fail over to vLLM",
            "next",
            f"{source.id} still carries weight {w_src}: Enter opens the plan that drains it "
            f"onto {standby.id}, the other replicas keeping theirs" + _failed(to_vllm),
            "fail_over",
            standby.id,
            source.id,
        )
    else:
        step = Check(
            "fail over to vLLM",
            "waiting",
            f"after {standby.id} is ready ({source.id} carries weight {w_src})",
        )
    checks.append(step)

    # 4. the rebuild drill
    if drill is None:
        checks.append(Check("rebuild drill", "blocked", f"no drill rebuilds {source.id}"))
    else:
        last = (
            f": last {last_drill.state} ({last_drill.id})"
            if last_drill is not None
            else ": never run"
        )
        if last_drill is not None and last_drill.state in OPEN:
            step = Check("rebuild drill", "running", f"drill {drill}{last}")
        elif rebuilt:
            step = Check("rebuild drill", "done", f"drill {drill}{last}; {source.id} is current")
        elif moved:
            step = Check(
                "rebuild drill",
                "next",
                f"drill {drill}{last}" + (": the engine is stale again" if passed else ""),
                "run_drill",
                source.id,
            )
        else:
            step = Check(
                "rebuild drill", "waiting", f"drill {drill}{last}; after the traffic is on vLLM"
            )
        checks.append(step)

    # 5. fail back
    if to_source is not None and to_source.state in OPEN:
        step = Check(
            "fail back to TensorRT-LLM",
            "running",
            f"job {to_source.id} moves the traffic back to {source.id}",
        )
    elif not rebuilt:
        step = Check("fail back to TensorRT-LLM", "waiting", "after the drill passes")
    elif fleet.gateway is None or w_src is None:
        step = Check("fail back to TensorRT-LLM", "blocked", unknown)
    elif w_src > 0 and src_ready:
        step = Check(
            "fail back to TensorRT-LLM", "done", f"{source.id} carries the traffic (weight {w_src})"
        )
    elif w_src > 0:
        step = Check(
            "fail back to TensorRT-LLM",
            "failed",
            f"{source.id} carries weight {w_src} but is {src_row.state if src_row else '?'}",
        )
    elif not src_ready:
        step = Check(
            "fail back to TensorRT-LLM",
            "waiting",
            f"after {source.id} is ready (it is {src_row.state if src_row else 'not reporting'})",
        )
    else:
        step = Check(
            "fail back to TensorRT-LLM",
            "next",
            f"move the traffic back to {source.id}" + _failed(to_source),
            "fail_back",
            source.id,
        )
    checks.append(step)
    return checks


def _source(fleet: Fleet, trt: list[Deployment], rows: Mapping[str, DeploymentRow]) -> Deployment:
    """The TensorRT-LLM deployment in trouble: a stale engine first, then one that is not
    ready, then one a drill rebuilds. It stays the same through the sequence: once
    rebuilt and current, it is still the one its drill rebuilds."""

    def rank(dep: Deployment) -> tuple[bool, bool, bool]:
        row = rows.get(dep.id)
        stale = row is not None and row.trt is not None and row.trt.state == "stale"
        ready = row is not None and row.state == "ready"
        return (not stale, ready, drill_rebuilding(fleet, dep.id) is None)

    return min(trt, key=rank)  # the first declared among equals


def _standby(source: Deployment, vllm: list[Deployment], to_vllm: Job | None) -> Deployment:
    """The vLLM deployment that takes the traffic: the last failover's target; else one
    with a launch profile (a standby one can start), beside the source first; else the
    first declared."""
    if to_vllm is not None:
        found = next((d for d in vllm if d.id == to_vllm.params.get("to")), None)
        if found is not None:
            return found
    startable = [d for d in vllm if d.profile]
    if startable:
        return min(startable, key=lambda d: (d.node != source.node, d.weight != 0))
    return vllm[0]


def _last_job(
    states: Mapping[str, NodeState], kind: str, param: str, value: str | None
) -> Job | None:
    """The newest agent job of `kind` whose `param` is `value`, on any node."""
    found = [
        job
        for state in states.values()
        for job in (state.snapshot.jobs if state.snapshot else [])
        if job.kind == kind and job.params.get(param) == value
    ]
    return max(found, key=lambda j: j.created or 0, default=None)


def _failed(job: Job | None) -> str:
    """What the last try said, when it did not succeed."""
    if job is None or job.state in ("succeeded", *OPEN):
        return ""
    return f"; the last try, job {job.id}, {job.state}" + (f": {job.error}" if job.error else "")
