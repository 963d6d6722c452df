"""`engineroom check`: poll the fleet once and print a compact table, or stable JSON.

Exit codes: 0 healthy, 1 degraded (a node stale or down, or any alert), 2 unreachable
(no node answered). The JSON keys are documented in docs/check-json.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any, TextIO

from console.collect.collector import Collector, NodeState
from console.collect.view import DeploymentRow, FleetView, build
from console.core.config import Fleet
from console.core.wire import Percentiles

EXIT = {"healthy": 0, "degraded": 1, "unreachable": 2}


async def poll_once(fleet: Fleet, timeout_s: float | None = None) -> tuple[FleetView, dict]:
    async with Collector(fleet, timeout_s=timeout_s) as collector:
        states = await collector.poll_all()
        return build(fleet, states, collector.refresh_s, history=collector.history), states


def run_check(
    fleet: Fleet,
    *,
    as_json: bool = False,
    watch: float | None = None,
    out: TextIO = sys.stdout,
    prometheus: bool = False,
) -> int:
    if watch is None:
        view, states = asyncio.run(poll_once(fleet))
        if prometheus:
            out.write(to_prometheus(fleet, view))
        else:
            out.write(to_json(view, states) + "\n" if as_json else render(view) + "\n")
        return EXIT[view.summary.status]
    return asyncio.run(_watch(fleet, watch, as_json, out))


async def _watch(fleet: Fleet, every: float, as_json: bool, out: TextIO) -> int:
    async with Collector(fleet, refresh_s=every) as collector:
        while True:
            started = time.monotonic()
            states = await collector.poll_all()
            view = build(fleet, states, collector.refresh_s, history=collector.history)
            text = to_json(view, states) if as_json else render(view)
            clear = "" if as_json or not out.isatty() else "\033[H\033[2J"
            out.write(f"{clear}{text}\n")
            out.flush()
            await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def _ms(p: Percentiles | None) -> str:
    if p is None:
        return "?"
    if p.p95 is not None:
        return _seconds(p.p95)
    if p.mean is not None:
        return "~" + _seconds(p.mean)  # a windowed mean, not a percentile
    return "?"


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.0f}"


def render(view: FleetView) -> str:
    s = view.summary
    lines = [
        f"fleet {s.name}  {s.environment}  {s.status.upper()}  nodes {s.nodes_up} up "
        f"{s.nodes_stale} stale {s.nodes_down} down  gpus {s.gpus}  util {_pct(s.util_avg)}  "
        f"alerts {s.alerts}",
        "",
        f"{'NODE':<14}{'STATUS':<8}{'GPUS':>5}  {'UTIL avg/max':<13}{'MEM GiB':<12}{'TEMP':>5}"
        f"  ENGINES",
    ]
    for n in view.nodes:
        mem = f"{_gib(n.mem_used)}/{_gib(n.mem_total)}" if n.mem_total else "?"
        util = f"{_pct(n.util_avg)}/{_pct(n.util_max)}" if n.gpus else "-"
        temp = f"{n.temp_max:.0f}C" if n.temp_max is not None else "?"
        detail = n.engines or "-"
        if n.status != "up" and n.error:
            detail = n.error
        status = n.status + ("/ssh" if n.transport == "ssh" else "")
        gpus = "?" if n.gpus is None else str(n.gpus)
        lines.append(f"{n.name:<14}{status:<8}{gpus:>5}  {util:<13}{mem:<12}{temp:>5}  {detail}")
    if view.models:
        lines += [
            "",
            f"{'MODEL / DEPLOYMENT':<26}{'ENGINE':<15}{'NODE':<10}{'STATE':<10}"
            f"{'TTFT95':>8}{'ITL95':>8}{'E2E95':>8}  SLO",
        ]
        for model, rows in view.models.items():
            lines.append(model)
            for r in rows:
                lines.append(_deployment_line(r))
    if view.alerts:
        lines += ["", "ALERTS"]
        for a in sorted(view.alerts, key=lambda a: a.severity != "critical"):
            tag = "CRIT" if a.severity == "critical" else "WARN"
            lines.append(f"  {tag} {a.subject}  {a.message}")
    return "\n".join(lines)


def _deployment_line(r: DeploymentRow) -> str:
    lat = r.stats.latency if r.stats else None
    slo = {True: "ok", False: "BREACH", None: "?"}[r.slo_ok]
    engine = f"{r.engine} {r.version or '?'}"[:18]
    name = r.id or "(undeclared)"
    return (
        f"  {name:<24}{engine:<15}{r.node:<10}{r.state:<10}"
        f"{_ms(lat.ttft_s if lat else None):>8}{_ms(lat.itl_s if lat else None):>8}"
        f"{_ms(lat.e2e_s if lat else None):>8}  {slo}"
    )


def to_dict(view: FleetView, states: dict[str, NodeState]) -> dict[str, Any]:
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
                "age_s": None if row.age_s is None else round(row.age_s, 3),
                "host": snap.host.model_dump() if snap else None,
                "gpu_status": snap.gpu_status if snap else None,
                "gpus": [
                    g.model_dump(exclude={"processes", "xid_events", "errors"}) for g in snap.gpus
                ]
                if snap
                else [],
                "engines": [
                    e.model_dump(
                        include={
                            "id",
                            "kind",
                            "endpoint",
                            "version",
                            "state",
                            "reason",
                            "deployment_ids",
                        }
                    )
                    for e in snap.engines
                ]
                if snap
                else [],
            }
        )
    models = []
    for name, rows in view.models.items():
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
                        "latency": r.stats.latency.model_dump() if r.stats else None,
                        "request_rate": r.stats.request_rate if r.stats else None,
                        "error_rate": r.stats.error_rate if r.stats else None,
                        "slo": r.slo,
                        "slo_ok": r.slo_ok,
                    }
                    for r in rows
                ],
            }
        )
    s = view.summary
    return {
        "fleet": s.name,
        "environment": s.environment,
        "status": s.status,
        "summary": {
            "nodes_up": s.nodes_up,
            "nodes_stale": s.nodes_stale,
            "nodes_down": s.nodes_down,
            "gpus": s.gpus,
            "util_avg": s.util_avg,
            "alerts": s.alerts,
        },
        "nodes": nodes,
        "models": models,
        "alerts": [
            {"severity": a.severity, "subject": a.subject, "message": a.message}
            for a in view.alerts
        ],
    }


def to_json(view: FleetView, states: dict[str, NodeState]) -> str:
    return json.dumps(to_dict(view, states), indent=2, sort_keys=False)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def to_prometheus(fleet: Fleet, view: FleetView) -> str:
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
        if row.age_s is not None:
            lines.append(
                f'engineroom_node_snapshot_age_seconds{{node="{_label(row.name)}"}} {row.age_s:.3f}'
            )
    lines += [
        "# HELP engineroom_alerts Alerts raised now, by severity.",
        "# TYPE engineroom_alerts gauge",
    ]
    for severity in ("critical", "warning"):
        count = sum(1 for a in view.alerts if a.severity == severity)
        lines.append(f'engineroom_alerts{{severity="{severity}"}} {count}')
    return "\n".join(lines) + "\n"
