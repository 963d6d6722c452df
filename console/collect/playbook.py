"""The incident playbook's plan for one model (no Textual here): a checklist over the
existing jobs for a stale or broken TensorRT-LLM deployment.

Start a vLLM standby, fail over to it, run the rebuild drill, fail back once it passed.
Each step's state comes from the fleet view, the agents' jobs in their snapshots and the
gateway's live weights; the Playbook screen draws it and does the step marked next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from console.collect.collector import NodeState
from console.collect.view import FleetView
from console.core.config import Fleet
from console.core.snapshot import Job


@dataclass
class Check:
    name: str
    state: str  # done | next | waiting | running | failed | blocked
    detail: str
    action: str | None = None  # what Enter does when this is the next step


def drill_rebuilding(fleet: Fleet, deployment: str) -> str | None:
    """The drill that rebuilds `deployment`, by name; None if no drill does."""
    return next((n for n, d in fleet.drills.items() if d.deployment == deployment), None)


def plan(
    fleet: Fleet,
    model_name: str,
    view: FleetView,
    states: Mapping[str, NodeState],
    gateway_snapshot: dict[str, Any] | None,
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
    source, standby = trt[0], vllm[0]
    src_row, sb_row = rows.get(source.id), rows.get(standby.id)
    live = (gateway_snapshot or {}).get("models", {}).get(model_name, {})

    def weight(dep_id: str, declared: int) -> int:
        return int(live.get(dep_id, {}).get("weight", declared)) if live else declared

    checks: list[Check] = []
    # 1. the TensorRT-LLM deployment
    stale = src_row is not None and src_row.trt is not None and src_row.trt.state == "stale"
    broken = src_row is None or src_row.state != "ready"
    why = []
    if stale and src_row is not None and src_row.trt is not None:
        why.append("REBUILD REQUIRED: " + "; ".join(src_row.trt.reasons))
    if broken:
        why.append(f"{source.id} is {src_row.state if src_row else 'not reporting'}")
    checks.append(
        Check(
            "TensorRT-LLM deployment",
            "failed" if why else "done",
            "; ".join(why) or f"{source.id} is ready and current: nothing to do",
        )
    )
    # 2. a vLLM standby
    ready = sb_row is not None and sb_row.state == "ready"
    starting = _running_job(states, "vllm.start")
    checks.append(
        Check(
            "vLLM standby",
            "done" if ready else ("running" if starting else "next"),
            f"{standby.id} is ready on {standby.node}"
            if ready
            else (f"job {starting} is starting it" if starting else "start it (launch profile)"),
            None if ready or starting else "start_standby",
        )
    )
    # 3. traffic on the standby
    moved = weight(source.id, source.weight) == 0 and weight(standby.id, standby.weight) > 0
    checks.append(
        Check(
            "fail over to vLLM",
            "done" if moved else ("next" if ready else "waiting"),
            f"{standby.id} carries the traffic"
            if moved
            else f"{source.id} still has weight {weight(source.id, source.weight)}"
            + (": Enter opens the failover plan" if ready else "")
            + ("" if fleet.gateway else " (no [gateway] declared)"),
            "fail_over" if ready and not moved else None,
        )
    )
    # 4. the rebuild drill
    drill = drill_rebuilding(fleet, source.id)
    last = _last_drill(states, drill) if drill else None
    passed = last is not None and last.state == "succeeded"
    if drill is None:
        checks.append(Check("rebuild drill", "blocked", f"no drill rebuilds {source.id}"))
    else:
        state = "waiting"
        if last is not None and last.state in ("queued", "running"):
            state = "running"
        elif passed and not stale:
            state = "done"
        elif moved:
            state = "next"
        detail = f"drill {drill}" + (
            f": last {last.state} ({last.id})" if last is not None else ": never run"
        )
        checks.append(
            Check("rebuild drill", state, detail, "run_drill" if state == "next" else None)
        )
    # 5. fail back
    rebuilt = checks[-1].state == "done"
    back = weight(source.id, source.weight) > 0 and not broken
    if rebuilt and back:
        checks.append(Check("fail back to TensorRT-LLM", "done", f"traffic on {source.id}"))
    elif rebuilt and moved:
        checks.append(
            Check(
                "fail back to TensorRT-LLM",
                "next",
                f"move the traffic back to {source.id}",
                "fail_back",
            )
        )
    else:
        checks.append(Check("fail back to TensorRT-LLM", "waiting", "after the drill passes"))
    return checks


def _running_job(states: Mapping[str, NodeState], kind: str) -> str | None:
    for state in states.values():
        for job in state.snapshot.jobs if state.snapshot else []:
            if job.kind == kind and job.state in ("queued", "running"):
                return str(job.id)
    return None


def _last_drill(states: Mapping[str, NodeState], drill: str) -> Job | None:
    found = [
        job
        for state in states.values()
        for job in (state.snapshot.jobs if state.snapshot else [])
        if job.kind == "drill.run" and job.params.get("drill") == drill
    ]
    return max(found, key=lambda j: j.created or 0, default=None)
