"""What `engineroom check` reads and prints (its verb: console/commands/check.py): the fleet
polled once, as a compact table, stable JSON or Prometheus text.

Exit codes: 0 healthy, 1 degraded (a node stale, down or without a token, any alert or any
diagnosis, console.collect.diagnose.diagnoser), 2 unreachable (no node answered). The JSON keys are
documented in docs/check-json.md.

Where a gateway is declared and its token is set, its own TTFT per deployment is read
too, so every latency says where it was measured (console.collect.views.measured): the engine
or the gateway, and the gap between them.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from console.collect.diagnose.diagnoser import CannotTell, Diagnosis, diagnose_once
from console.collect.prometheus.source import fleet_source
from console.collect.sources.collector import NodeState
from console.collect.sources.source import SourceHealth
from console.collect.views.gateway_view import GatewayDeployment, GatewayView, parse
from console.collect.views.measured import ENGINE, GATEWAY, gap_text, ttft_gap_s
from console.collect.views.view import DeploymentRow, FleetView, build
from console.core import diagnosis as d
from console.core.config.load import Fleet
from console.core.safetext import for_terminal
from console.core.slo import Verdict, times_text
from console.core.snapshot import Percentiles, plain
from console.core.units import duration_from_seconds, gib_from_bytes

EXIT = {"healthy": 0, "degraded": 1, "unreachable": 2}
# The engine fields `check --json` gives (docs/check-json.md).
_ENGINE_KEYS = (
    "id",
    "kind",
    "endpoint",
    "version",
    "state",
    "reason",
    "deployment_ids",
    "api_server_cpu_pct",
)
# A deployment's engine figures, as the snapshot names them (docs/check-json.md).
_ENGINE_FIGURES = (
    "generation_tokens_rate",
    "preemption_rate",
    "requests_waiting_by_reason",
    "prefix_cache_hit_rate",
    "generation_stalled_s",
    "completion_stalled_s",
)


def _without(d: Any, *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


@dataclass
class GatewayReading:
    """The gateway's admin snapshot (parsed: console.collect.views.gateway_view), or why there is
    none (None, None: no gateway)."""

    url: str | None = None
    snapshot: GatewayView | None = None
    error: str | None = None


async def read_gateway(fleet: Fleet, timeout_s: float) -> GatewayReading:
    from console.collect.clients.gateway_client import GatewayClient, GatewayError

    if fleet.gateway is None:
        return GatewayReading()
    url = fleet.gateway.url
    if not GatewayClient.configured(fleet):
        return GatewayReading(url, error=f"no token ({fleet.gateway.token_env} is not set)")
    client = GatewayClient(fleet, timeout=timeout_s)
    try:
        return GatewayReading(url, snapshot=parse(await client.snapshot()))
    except GatewayError as exc:
        return GatewayReading(url, error=str(exc))
    finally:
        await client.close()


async def poll_once(
    fleet: Fleet, timeout_s: float | None = None
) -> tuple[FleetView, dict[str, NodeState], GatewayReading, SourceHealth | None]:
    """One poll of the fleet, through the agents or Prometheus (`source`: how that went)."""
    async with fleet_source(fleet, timeout_s=timeout_s) as collector:
        states, gateway = await asyncio.gather(
            collector.poll_all(), read_gateway(fleet, collector.timeout_s)
        )
        view = build(
            fleet, states, collector.refresh_s, history=collector.history, gateway=gateway.snapshot
        )
        return view, states, gateway, collector.health


@dataclass
class Diagnosed:
    """The diagnoses of one look (console.collect.diagnose.diagnoser), and where they cannot
    tell."""

    found: list[Diagnosis]
    cannot_tell: list[CannotTell]

    def as_dict(self) -> dict[str, Any]:
        return {
            "diagnoses": [x.as_dict() for x in self.found],
            "diagnoses_cannot_tell": [
                {"name": c.name, "subject": c.subject, "needs": c.needs} for c in self.cannot_tell
            ],
        }


def diagnosed(
    fleet: Fleet, view: FleetView, states: dict[str, NodeState], gateway: GatewayReading
) -> Diagnosed:
    return Diagnosed(*diagnose_once(fleet, view, states, gateway.snapshot))


def status_of(
    view: FleetView, source: SourceHealth | None, diagnoses: Diagnosed | None = None
) -> str:
    """The check's status: a Prometheus that did not answer leaves nothing known; a
    diagnosis on a fleet otherwise healthy makes it degraded."""
    if source is not None and source.ok is False and not view.summary.nodes_up:
        return "unreachable"
    if view.summary.status == "healthy" and diagnoses is not None and diagnoses.found:
        return "degraded"
    return view.summary.status


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def _p95(p: Percentiles | None) -> str:
    """A p95, or "?": a windowed mean is never printed as one (the SLO column names it)."""
    return duration_from_seconds(None if p is None else p.p95)


def slo_text(verdict: Verdict) -> str:
    """The SLO column: "ok", "WARN 1.3x ttft at the gateway", "CRIT 88x itl at the
    engine", "? mean only (ttft 75ms, itl 10ms)", "? no figure", "? no SLO"."""
    worst = verdict.worst
    if worst is not None:
        tag = "CRIT" if worst.level == "critical" else "WARN"
        return f"{tag} {times_text(worst.times)} {worst.figure} at the {worst.measured_at}"
    if verdict.level == "ok":
        return "ok"
    means = [
        f"{j.figure} {duration_from_seconds(j.mean)} mean"
        for j in verdict.figures
        if j.mean is not None
    ]
    if means:
        return f"? mean only ({', '.join(means)}), no p95"
    bound = [j for j in verdict.figures if j.limit is not None]
    return "? no SLO" if not bound else "? no figure"


def render(
    view: FleetView,
    gateway: GatewayReading | None = None,
    source: SourceHealth | None = None,
    diagnoses: Diagnosed | None = None,
) -> str:
    s = view.summary
    no_token = f" {s.nodes_no_token} no token" if s.nodes_no_token else ""
    # Blind to part of the fleet: said first, and "alerts 0" would be a guess.
    blind = f"  CANNOT SEE {s.unseen} OF {s.nodes} NODES" if s.unseen else ""
    alerts = f"? ({s.unseen} nodes unseen)" if s.unseen and not s.alerts else str(s.alerts)
    lines = [
        f"fleet {s.name}  {s.environment}  {status_of(view, source, diagnoses).upper()}{blind}"
        f"  nodes "
        f"{s.nodes_up} up {s.nodes_stale} stale {s.nodes_down} down{no_token}  gpus {s.gpus}  "
        f"util {_pct(s.util_avg)}  alerts {alerts}",
        *([source.line()] if source is not None else []),
        "",
        f"{'NODE':<14}{'STATUS':<10}{'GPUS':>5}  {'UTIL avg/max':<13}{'MEM GiB':<12}{'TEMP':>5}"
        f"  ENGINES",
    ]
    for n in view.nodes:
        mem = f"{gib_from_bytes(n.mem_used)}/{gib_from_bytes(n.mem_total)}" if n.mem_total else "?"
        util = f"{_pct(n.util_avg)}/{_pct(n.util_max)}" if n.gpus else "-"
        temp = f"{n.temp_max:.0f}C" if n.temp_max is not None else "?"
        detail = n.engines or "-"
        if n.status == "no token":
            detail = f"no token ({n.error})"
        elif n.status != "up" and n.error:
            detail = n.error
        status = n.status + ("/ssh" if n.transport == "ssh" else "")
        gpus = "?" if n.gpus is None else str(n.gpus)
        lines.append(f"{n.name:<14}{status:<10}{gpus:>5}  {util:<13}{mem:<12}{temp:>5}  {detail}")
    if view.models:
        # Two header lines: what, and where it was measured (console.collect.views.measured).
        lines += [
            "",
            f"{'MODEL / DEPLOYMENT':<26}{'ENGINE':<20}{'NODE':<10}{'STATE':<10}"
            f"{'TTFT95':>8}{'TTFT95':>9}{'GAP':>8}{'ITL95':>8}{'E2E95':>8}  SLO",
            f"{'':<66}{ENGINE:>8}{GATEWAY:>9}{'gw-eng':>8}{ENGINE:>8}{ENGINE:>8}",
        ]
        snapshot = gateway.snapshot if gateway else None
        for model, rows in view.models.items():
            lines.append(model)
            for r in rows:
                at = snapshot.at(model, r.id) if snapshot is not None else None
                lines.append(_deployment_line(r, at))
    if gateway is not None and gateway.error:
        lines += ["", f"gateway {gateway.url}: {gateway.error} (no TTFT95 at the gateway)"]
    if diagnoses is not None and (diagnoses.found or diagnoses.cannot_tell):
        lines += ["", "DIAGNOSES (engineroom diagnose: the evidence and the moves)"]
        for x in diagnoses.found:
            tag = "CRIT" if x.kind.severity == "critical" else "WARN"
            lines.append(f"  {tag} {x.headline()}  -> {d.MOVE_TEXT[x.moves[0]]}")
        lines += [f"  ? {c.line()}" for c in diagnoses.cannot_tell]
    if view.alerts:
        lines += ["", "ALERTS"]
        for a in sorted(view.alerts, key=lambda a: a.severity != "critical"):
            tag = "CRIT" if a.severity == "critical" else "WARN"
            lines.append(f"  {tag} {a.subject}  {a.message}")
    # Names, versions, errors and alerts come from agents, engines and Prometheus: each
    # line is made safe for the terminal as a whole, so no field can be missed.
    return "\n".join(map(for_terminal, lines))


def _deployment_line(r: DeploymentRow, gw: GatewayDeployment | None) -> str:
    lat = r.stats.latency if r.stats else None
    slo = "-" if r.standby else slo_text(r.verdict)  # a standby takes no traffic to judge
    engine = for_terminal(f"{r.engine} {r.version or '?'}")  # cut after, never inside a sequence
    engine = engine if len(engine) < 20 else engine[:18] + "…"
    name = r.id or "(undeclared)"
    state = "standby" if r.standby else r.state
    if gw is None:
        at_gateway = "-"
    elif gw.down:
        at_gateway = "standby" if r.standby else "down"
    else:
        at_gateway = duration_from_seconds(gw.ttft_p95)
    gap = ttft_gap_s(lat.ttft_s if lat else None, gw)
    gap_shown = gap_text(gap, lat.ttft_s.p95 if lat else None, duration_from_seconds)
    return (
        f"  {name:<24}{engine:<20}{r.node:<10}{state:<10}"
        f"{_p95(lat.ttft_s if lat else None):>8}{at_gateway:>9}{gap_shown:>8}"
        f"{_p95(lat.itl_s if lat else None):>8}{_p95(lat.e2e_s if lat else None):>8}  {slo}"
    )


def _gateway_latency(gw: GatewayDeployment | None) -> dict[str, Any] | None:
    if gw is None:
        return None
    ttft = gw.ttft_s
    return {
        "measured_at": GATEWAY,
        "up": gw.up,
        "weight": gw.weight,
        "ttft_s": {"p50": ttft.p50, "p95": ttft.p95, "p99": ttft.p99, "count": ttft.count},
    }


def to_dict(
    view: FleetView,
    states: dict[str, NodeState],
    gateway: GatewayReading | None = None,
    source: SourceHealth | None = None,
    diagnoses: Diagnosed | None = None,
) -> dict[str, Any]:
    snapshot = gateway.snapshot if gateway else None
    nodes = []
    for row in view.nodes:
        snap = states[row.name].snapshot
        nodes.append(
            {
                "name": row.name,
                "status": row.status,
                "transport": row.transport,
                "source": snap.source if snap else None,
                "missing": snap.missing if snap else [],
                "error": row.error,
                "age_s": None if (age := states[row.name].age()) is None else round(age, 3),
                "host": plain(snap.host) if snap else None,
                "gpu_status": snap.gpu_status if snap else None,
                "gpus": [_without(plain(g), "processes", "xid_events", "errors") for g in snap.gpus]
                if snap
                else [],
                "engines": [{k: getattr(e, k) for k in _ENGINE_KEYS} for e in snap.engines]
                if snap
                else [],
            }
        )
    models = []
    for name, rows in view.models.items():
        measures = {r.id: snapshot.at(name, r.id) if snapshot is not None else None for r in rows}
        models.append(
            {
                "name": name,
                "deployments": [
                    {
                        "id": r.id or None,
                        "node": r.node,
                        "engine": r.engine,
                        "engine_id": r.engine_id,
                        "version": r.version,
                        "state": r.state,
                        "reason": r.reason,
                        "weight": r.weight,
                        "standby": r.standby,
                        "latency": plain(r.stats.latency) if r.stats else None,
                        "latency_measured_at": ENGINE,
                        "gateway_latency": _gateway_latency(measures[r.id]),
                        "ttft_p95_gap_s": ttft_gap_s(
                            r.stats.latency.ttft_s if r.stats else None, measures[r.id]
                        ),
                        "request_rate": r.stats.request_rate if r.stats else None,
                        "error_rate": r.stats.error_rate if r.stats else None,
                        **{k: getattr(r.stats, k) if r.stats else None for k in _ENGINE_FIGURES},
                        "slo": r.slo,
                        "slo_ok": r.slo_ok,
                        "slo_verdict": r.verdict.as_dict(),
                    }
                    for r in rows
                ],
            }
        )
    s = view.summary
    return {
        "fleet": s.name,
        "environment": s.environment,
        "status": status_of(view, source, diagnoses),
        "prometheus": None if source is None else source.as_dict(),
        "summary": {
            "nodes_up": s.nodes_up,
            "nodes_stale": s.nodes_stale,
            "nodes_down": s.nodes_down,
            "nodes_no_token": s.nodes_no_token,
            "nodes_unseen": s.unseen,
            "gpus": s.gpus,
            "util_avg": s.util_avg,
            "alerts": s.alerts,
        },
        "nodes": nodes,
        "gateway": None
        if gateway is None or gateway.url is None
        else {"url": gateway.url, "error": gateway.error},
        "models": models,
        "alerts": [
            {"severity": a.severity, "subject": a.subject, "message": a.message}
            for a in view.alerts
        ],
        **(diagnoses or Diagnosed([], [])).as_dict(),
    }


def to_json(
    view: FleetView,
    states: dict[str, NodeState],
    gateway: GatewayReading | None = None,
    source: SourceHealth | None = None,
    diagnoses: Diagnosed | None = None,
) -> str:
    return json.dumps(to_dict(view, states, gateway, source, diagnoses), indent=2)


def _label(value: str) -> str:
    """A label value in Prometheus text, which a person may read on a terminal too (a
    newline is already `\\n` there)."""
    return for_terminal(value).replace("\\", "\\\\").replace('"', '\\"')


def to_prometheus(fleet: Fleet, view: FleetView, states: dict[str, NodeState]) -> str:
    """The check as Prometheus text (for node_exporter's textfile collector, say)."""
    name = _label(fleet.fleet.name)
    lines = [
        "# HELP engineroom_check_status 0 healthy, 1 degraded, 2 unreachable (the exit code).",
        "# TYPE engineroom_check_status gauge",
        f'engineroom_check_status{{fleet="{name}"}} {EXIT[view.summary.status]}',
        "# HELP engineroom_node_up 1 when the node's newest snapshot is fresh.",
        "# TYPE engineroom_node_up gauge",
    ]
    for row in view.nodes:
        labels = f'node="{_label(row.name)}",transport="{row.transport}"'
        lines.append(f"engineroom_node_up{{{labels}}} {int(row.status == 'up')}")
    lines += [
        "# HELP engineroom_node_snapshot_age_seconds Age of the newest snapshot (absent: none).",
        "# TYPE engineroom_node_snapshot_age_seconds gauge",
    ]
    for row in view.nodes:
        if (age := states[row.name].age()) is not None:
            lines.append(
                f'engineroom_node_snapshot_age_seconds{{node="{_label(row.name)}"}} {age:.3f}'
            )
    lines += [
        "# HELP engineroom_alerts Alerts raised now, by severity.",
        "# TYPE engineroom_alerts gauge",
    ]
    for severity in ("critical", "warning"):
        count = sum(1 for a in view.alerts if a.severity == severity)
        lines.append(f'engineroom_alerts{{severity="{severity}"}} {count}')
    return "\n".join(lines) + "\n"
