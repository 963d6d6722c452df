"""The fleet as the screens and `engineroom check` show it: rows built from node states.

Pure functions of (fleet file, node states, time), so every screen and the headless
check agree, and tests need no terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from console.collect.alerts import NOT_REPORTED, Alert, evaluate
from console.collect.collector import NodeState, NodeStatus
from console.collect.history import History
from console.core.config import Deployment, Fleet, Model
from console.core.wire import Engine, Gpu, ModelStats, Snapshot, TrtEngine

SloState = Literal["ok", "breach", "unknown"]


@dataclass
class NodeRow:
    name: str
    status: NodeStatus
    transport: str
    age_s: float | None
    error: str | None
    gpus: int | None
    util_avg: float | None
    util_max: float | None
    mem_used: int | None
    mem_total: int | None
    temp_max: float | None
    engines: str
    alerts: int
    gpu_status: str | None


@dataclass(slots=True)
class GpuCell:
    node: str
    node_status: NodeStatus
    gpu: Gpu


@dataclass
class DeploymentRow:
    model: str
    id: str  # "" for an engine found on a node but declared nowhere
    node: str
    engine: str  # plugin kind
    engine_id: str | None
    version: str | None
    state: str
    reason: str | None
    weight: int | None
    stats: ModelStats | None
    slo: dict[str, SloState] = field(default_factory=dict)  # ttft, itl, e2e, errors
    trt: TrtEngine | None = None  # a TensorRT-LLM engine's provenance: current, stale, unknown

    @property
    def standby(self) -> bool:
        """Declared with weight 0 and down: a standby nobody started, not an outage."""
        return self.weight == 0 and self.state == "down"

    @property
    def slo_ok(self) -> bool | None:
        known = [v for v in self.slo.values() if v != "unknown"]
        if not known:
            return None
        return all(v == "ok" for v in known)


@dataclass
class Summary:
    name: str
    environment: str
    read_only: bool
    nodes_up: int
    nodes_stale: int
    nodes_down: int
    nodes_waiting: int  # not polled yet
    gpus: int
    util_avg: float | None
    alerts: int
    critical: int
    nodes_no_token: int = 0  # not polled: the token variable is not set here

    @property
    def status(self) -> Literal["healthy", "degraded", "unreachable"]:
        unseen = self.nodes_down + self.nodes_no_token
        if unseen and self.nodes_up + self.nodes_stale + self.nodes_waiting == 0:
            return "unreachable"
        # A node this console holds no token for is not known to be healthy.
        if self.nodes_stale or unseen or self.alerts:
            return "degraded"
        return "healthy"


@dataclass
class FleetView:
    summary: Summary
    nodes: list[NodeRow]
    gpus: list[GpuCell]
    models: dict[str, list[DeploymentRow]]
    alerts: list[Alert]


def _avg(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def node_row(state: NodeState, refresh_s: float, alerts: int, now: float) -> NodeRow:
    snap = state.snapshot
    status = state.status(refresh_s, now)
    utils = [g.utilization_pct for g in snap.gpus if g.utilization_pct is not None] if snap else []
    temps = [g.temperature_c for g in snap.gpus if g.temperature_c is not None] if snap else []
    used = (
        [g.memory_used_bytes for g in snap.gpus if g.memory_used_bytes is not None] if snap else []
    )
    total = (
        [g.memory_total_bytes for g in snap.gpus if g.memory_total_bytes is not None]
        if snap
        else []
    )
    engines = engine_summary(snap.engines) if snap else ""
    return NodeRow(
        name=state.name,
        status=status,
        transport=state.transport,
        age_s=state.age(now),
        error=state.error,
        gpus=len(snap.gpus) if snap else None,
        util_avg=_avg(utils),
        util_max=max(utils) if utils else None,
        mem_used=sum(used) if used else None,
        mem_total=sum(total) if total else None,
        temp_max=max(temps) if temps else None,
        engines=engines,
        alerts=alerts,
        gpu_status=snap.gpu_status if snap else None,
    )


def engine_summary(engines: list[Engine]) -> str:
    """ "vllm 0.32.0 x3, triton 2.51.0": which engine versions run here, at a glance."""
    counts: dict[str, int] = {}
    for e in engines:
        label = f"{e.kind} {e.version or '?'}"
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{label} x{n}" if n > 1 else label for label, n in counts.items())


def _slo_state(value: float | None, limit: float | None) -> SloState:
    if limit is None or value is None:
        return "unknown"
    return "ok" if value <= limit else "breach"


def slo_states(model: Model, stats: ModelStats | None, error_limit: float) -> dict[str, SloState]:
    lat = stats.latency if stats else None
    slo = model.slo
    ms = 1000.0

    def seconds(v: float | None) -> float | None:
        return None if v is None else v * ms

    return {
        "ttft": _slo_state(seconds(lat.ttft_s.p95_or_mean) if lat else None, slo.ttft_p95_ms),
        "itl": _slo_state(seconds(lat.itl_s.p95_or_mean) if lat else None, slo.itl_p95_ms),
        "e2e": _slo_state(seconds(lat.e2e_s.p95_or_mean) if lat else None, slo.e2e_p95_ms),
        "errors": _slo_state(
            stats.error_rate if stats else None,
            slo.error_rate if slo.error_rate is not None else error_limit,
        ),
    }


def _find_engine(snap: Snapshot | None, deployment_id: str) -> Engine | None:
    if snap is None:
        return None
    for engine in snap.engines:
        if deployment_id in engine.deployment_ids:
            return engine
    return None


def _model_stats(engine: Engine | None, names: list[str]) -> ModelStats | None:
    if engine is None:
        return None
    for model in engine.models:
        if model.name in names:
            return model
    return engine.models[0] if len(engine.models) == 1 else None


def deployment_row(
    model: Model,
    dep: Deployment,
    state: NodeState | None,
    refresh_s: float,
    error_limit: float,
    now: float,
) -> DeploymentRow:
    status = state.status(refresh_s, now) if state else "unknown"
    snap = state.snapshot if state and status in ("up", "stale") else None
    engine = _find_engine(snap, dep.id)
    stats = _model_stats(engine, [n for n in (dep.engine_model, model.name) if n])
    engine_state: str
    if engine is not None:
        engine_state, reason = engine.state, engine.reason
    elif snap is not None:
        engine_state, reason = "unknown", NOT_REPORTED
    elif status == "no token" and state is not None:
        engine_state, reason = "unknown", f"node {dep.node}: no token ({state.error})"
    else:
        engine_state, reason = "unknown", f"node {dep.node} is {status}"
    return DeploymentRow(
        model=model.name,
        id=dep.id,
        node=dep.node,
        engine=dep.engine,
        engine_id=engine.id if engine else None,
        version=engine.version if engine else None,
        state=engine_state,
        reason=reason,
        weight=dep.weight,
        stats=stats,
        slo=slo_states(model, stats, error_limit),
        trt=next((t for t in snap.trt_engines if t.deployment == dep.id), None) if snap else None,
    )


def build(
    fleet: Fleet,
    states: dict[str, NodeState],
    refresh_s: float,
    now: float | None = None,
    history: History | None = None,
) -> FleetView:
    now = time.monotonic() if now is None else now
    models: dict[str, list[DeploymentRow]] = {}
    declared: set[tuple[str, str]] = set()  # (node, engine id) shown through a deployment
    error_limit = fleet.thresholds.error_rate
    for model in fleet.models:
        rows = models.setdefault(model.name, [])
        for dep in model.deployments:
            row = deployment_row(model, dep, states.get(dep.node), refresh_s, error_limit, now)
            rows.append(row)
            if row.engine_id:
                declared.add((dep.node, row.engine_id))
    # Engines that serve a model but are in no deployment: shown, so nothing hides.
    known_models = {m.name: m for m in fleet.models}
    for name, state in states.items():
        if state.snapshot is None or state.status(refresh_s, now) not in ("up", "stale"):
            continue
        for engine in state.snapshot.engines:
            if (name, engine.id) in declared:
                continue
            for stats in engine.models:
                model = known_models.get(stats.name) or Model(name=stats.name)
                models.setdefault(stats.name, []).append(
                    DeploymentRow(
                        model=stats.name,
                        id="",
                        node=name,
                        engine=engine.kind,
                        engine_id=engine.id,
                        version=engine.version,
                        state=engine.state,
                        reason=engine.reason,
                        weight=None,
                        stats=stats,
                        slo=slo_states(model, stats, error_limit),
                    )
                )
    alerts = evaluate(fleet, states, models, refresh_s, now, history)
    per_node: dict[str, int] = {}
    for alert in alerts:
        if alert.node:
            per_node[alert.node] = per_node.get(alert.node, 0) + 1
    node_rows = [
        node_row(states[n.name], refresh_s, per_node.get(n.name, 0), now) for n in fleet.nodes
    ]
    cells: list[GpuCell] = []
    for r in node_rows:
        snap = states[r.name].snapshot
        cells.extend(GpuCell(r.name, r.status, g) for g in (snap.gpus if snap else []))
    utils = [
        c.gpu.utilization_pct
        for c in cells
        if c.gpu.utilization_pct is not None and c.node_status in ("up", "stale")
    ]
    summary = Summary(
        name=fleet.fleet.name,
        environment=fleet.fleet.environment,
        read_only=fleet.read_only,
        nodes_up=sum(r.status == "up" for r in node_rows),
        nodes_stale=sum(r.status == "stale" for r in node_rows),
        nodes_down=sum(r.status == "down" for r in node_rows),
        nodes_waiting=sum(r.status == "unknown" for r in node_rows),
        gpus=len(cells),
        util_avg=_avg(utils),
        alerts=len(alerts),
        critical=sum(a.severity == "critical" for a in alerts),
        nodes_no_token=sum(r.status == "no token" for r in node_rows),
    )
    return FleetView(summary, node_rows, cells, models, alerts)
