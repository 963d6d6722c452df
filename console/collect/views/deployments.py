"""A deployment's row in the view: its engine's state and figures, and its SLO verdict.

The verdict is console/core/slo.py's, judged on what clients feel: the gateway's figures
where its admin snapshot measured the deployment, else the engine's. The view makes a
row when its node's snapshot changes (view.ViewBuilder) and judges it again when the
gateway's snapshot changes (`rejudged`), so Models, the alerts and `check` read one
verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from console.collect.sources.collector import NodeState, NodeStatus
from console.collect.views.gateway_view import GatewayDeployment, GatewayView
from console.core.config.load import Deployment, Model
from console.core.slo import UNKNOWN, Verdict, Word, judge
from console.core.snapshot import Engine, ModelStats, Snapshot, TrtEngine

# A declared deployment its node's agent does not report (the alerts raise on it).
NOT_REPORTED = "the agent does not report this deployment"


@dataclass(slots=True)
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
    verdict: Verdict = UNKNOWN  # the SLO's (console/core/slo.py)
    trt: TrtEngine | None = None  # a TensorRT-LLM engine's provenance: current, stale, unknown
    # The gateway's figures it was judged on (kept while the verdict holds), if any.
    gateway: GatewayDeployment | None = None

    @property
    def standby(self) -> bool:
        """Declared with weight 0 and down: a standby nobody started, not an outage."""
        return self.weight == 0 and self.state == "down"

    @property
    def slo(self) -> dict[str, Word]:
        """Each figure's word: ok, breach, unknown (check --json's "slo")."""
        return self.verdict.words()

    @property
    def slo_ok(self) -> bool | None:
        """True: every figure the SLO bounds is known and within it; False: one is over;
        None: unknown (a mean, no requests, no reading), never taken for ok."""
        return self.verdict.ok


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
    bounds: tuple[float | None, ...],
    now: float,
    status: NodeStatus | None = None,
    gateway: GatewayView | None = None,
) -> DeploymentRow:
    """`bounds`: the model's SLO limits (console.core.slo.limits); `gateway`: the gateway's
    view, whose figures for this deployment judge it where it has them."""
    if status is None:
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
    measure = gateway.at(model.name, dep.id) if gateway is not None else None
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
        verdict=judge(bounds, stats, measure),
        trt=next((t for t in snap.trt_engines if t.deployment == dep.id), None) if snap else None,
        gateway=measure,
    )


def undeclared_row(
    node: str, engine: Engine, stats: ModelStats, bounds: tuple[float | None, ...]
) -> DeploymentRow:
    """An engine serving a model that no deployment declares (the gateway routes none)."""
    return DeploymentRow(
        model=stats.name,
        id="",
        node=node,
        engine=engine.kind,
        engine_id=engine.id,
        version=engine.version,
        state=engine.state,
        reason=engine.reason,
        weight=None,
        stats=stats,
        verdict=judge(bounds, stats),
    )


def rejudged(
    row: DeploymentRow, bounds: tuple[float | None, ...], gateway: GatewayView | None
) -> DeploymentRow:
    """The row judged on a new gateway snapshot: itself when neither the gateway's
    figures for it nor its verdict changed, else a new row (screens keep what they made
    of a row while it is the same object)."""
    if not row.id:
        return row
    measure = gateway.at(row.model, row.id) if gateway is not None else None
    if measure == row.gateway:
        return row
    verdict = judge(bounds, row.stats, measure)
    return row if verdict == row.verdict else replace(row, verdict=verdict, gateway=measure)
