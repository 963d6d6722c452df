"""Which deployment should take a model's traffic: its deployments ranked healthiest first,
each with the reason in words, for the failover screen's preselection and the CLI (no
Textual here).

Healthiest: ready (its engine ready and the gateway not marking it down), then meeting its
SLO (ok before unknown before breached), then the most headroom: no queue before a queue,
then the emptiest KV cache, then the lowest TTFT p95 against the SLO. A figure that is
unknown ranks after every known one and reads "?", never as 0 (issue 28: the sickest
deployment, TTFT p95 20 s, queue 90, KV 88 %, was preselected because it came first in the
file).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from console.collect.views.gateway_view import GatewayDeployment
from console.core.config.load import Model
from console.core.snapshot import ModelStats
from console.core.units import ms_from_seconds


class Row(Protocol):
    """What the ranking reads of a deployment's row in the fleet view."""

    id: str
    state: str
    stats: ModelStats | None

    @property
    def slo_ok(self) -> bool | None: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    id: str
    ready: bool
    slo_ok: bool | None  # True within its SLO, False over it, None unknown
    queue: float | None
    kv: float | None  # 0..1
    ttft_p95_s: float | None  # the gateway's where it measured one, else the engine's
    ttft_from: str  # "gateway", "engine" or "" (unknown)
    why: str  # "ready, p95 within SLO, KV 23 %, queue 0"

    def key(self, slo_ms: float | None) -> tuple[float, ...]:
        """Sorts healthiest first (lower is healthier)."""
        slo_rank = {True: 0, None: 1, False: 2}[self.slo_ok]
        queued = 1.0 if self.queue is None else (0.0 if self.queue <= 0 else 0.5)
        # In steps of a tenth: a KV cache at 21 % and one at 19 % are as roomy, and the
        # declared order decides, so the choice does not flip from one refresh to the next.
        kv = 2.0 if self.kv is None else round(self.kv, 1)
        if self.ttft_p95_s is None:
            p95 = math.inf
        else:
            p95 = round(self.ttft_p95_s * 1000 / slo_ms, 1) if slo_ms else self.ttft_p95_s
        return (0.0 if self.ready else 1.0, slo_rank, queued, kv, p95)


def _ttft(stats: ModelStats | None, gateway: GatewayDeployment | None) -> tuple[float | None, str]:
    """The TTFT p95 clients feel: the gateway's where it measured one, else the engine's
    own p95 (a mean is not a p95: unknown)."""
    if gateway is not None and gateway.ttft_p95 is not None:
        return gateway.ttft_p95, "gateway"
    engine = None if stats is None else stats.latency.ttft_s
    if engine is not None and engine.source != "mean" and engine.p95 is not None:
        return engine.p95, "engine"
    return None, ""


def candidate(row: Row, gateway: GatewayDeployment | None, slo_ms: float | None) -> Candidate:
    """One deployment, judged for taking traffic."""
    down_at_gateway = gateway is not None and gateway.down
    ready = row.state == "ready" and not down_at_gateway
    stats = row.stats
    queue = None if stats is None else stats.requests_waiting
    kv = None if stats is None else stats.kv_cache_usage
    ttft, where = _ttft(stats, gateway)
    words = [
        "ready"
        if ready
        else (f"engine {row.state}, down at the gateway" if down_at_gateway else row.state),
        {True: "p95 within SLO", False: "over its SLO", None: "SLO unknown"}[row.slo_ok],
        f"KV {'?' if kv is None else f'{kv:.0%}'}",
        f"queue {'?' if queue is None else f'{queue:g}'}",
    ]
    if ttft is not None:
        words.append(f"TTFT p95 {ms_from_seconds(ttft)} ({where})")
    return Candidate(row.id, ready, row.slo_ok, queue, kv, ttft, where, ", ".join(words))


def rank(
    model: Model,
    rows: Iterable[Row],
    gateway: Mapping[str, GatewayDeployment] | None,
    exclude: Iterable[str] = (),
) -> list[Candidate]:
    """The model's declared deployments but `exclude`, healthiest first (declared order
    among equals). `rows`: the view's rows of the model; `gateway`: the gateway's
    deployments of the model (GatewayView.routes), None when it was not read."""
    by_id = {r.id: r for r in rows if r.id}
    skip = set(exclude)
    slo_ms = model.slo.ttft_p95_ms
    found = []
    for dep in model.deployments:
        if dep.id in skip:
            continue
        row = by_id.get(dep.id)
        figures = gateway.get(dep.id) if gateway is not None else None
        if row is None:
            found.append(Candidate(dep.id, False, None, None, None, None, "", "not read"))
        else:
            found.append(candidate(row, figures, slo_ms))
    return sorted(found, key=lambda c: c.key(slo_ms))  # stable: declared order among equals


def preselected(candidates: list[Candidate]) -> str:
    """What the plan says of the first candidate: "preselected X: ready, ...", or that
    none is ready."""
    if not candidates:
        return "no other deployment to move the traffic to"
    best = candidates[0]
    if not best.ready:
        return f"no deployment is ready; first listed {best.id}: {best.why}"
    return f"preselected {best.id}: {best.why}"
