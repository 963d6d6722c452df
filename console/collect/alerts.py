"""Alerts from the thresholds in fleet.toml, and the log of alerts raised and cleared.

Raised on: a node down or stale, a GPU over its temperature thresholds, uncorrected ECC
errors or XID events, a deployment over its SLO (p95 TTFT or ITL, e2e, error rate), a
KV cache nearly full, a queue that keeps growing, an engine not ready.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Literal

from console.collect.collector import NodeState, NodeStatus
from console.collect.history import History
from console.core.config import Fleet, Model
from console.core.snapshot import Snapshot

if TYPE_CHECKING:
    from console.collect.view import DeploymentRow

Severity = Literal["critical", "warning"]
NOT_REPORTED = "the agent does not report this deployment"


@dataclass(frozen=True, slots=True)
class Alert:
    severity: Severity
    subject: str  # what it is about: "gpu-a1", "gpu-a1/gpu3", "llama-8b/llama8b-trt"
    message: str
    node: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.subject, self.message.split(":", 1)[0])


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def status_alert(name: str, state: NodeState, status: NodeStatus, now: float) -> Alert | None:
    """A node down or stale: its own alert, worded with its error and age."""
    if status == "down":
        return Alert("critical", name, f"node down: {state.error or 'no answer'}", name)
    if status == "stale":
        age = state.age(now) or 0.0
        return Alert(
            "warning",
            name,
            f"node stale: last snapshot {age:.0f} s ago"
            + (f" ({state.error})" if state.error else ""),
            name,
        )
    return None


def snapshot_alerts(fleet: Fleet, name: str, snap: Snapshot) -> list[Alert]:
    """What one node's snapshot says about its GPUs and engines' builds."""
    t = fleet.thresholds
    out: list[Alert] = []
    if snap.gpu_status != "ok" and snap.gpus:
        out.append(Alert("warning", name, f"NVML: {snap.gpu_status}", name))
    for gpu in snap.gpus:
        subject = f"{name}/gpu{gpu.index}"
        if gpu.temperature_c is not None and gpu.temperature_c >= t.gpu_temp_crit_c:
            out.append(
                Alert(
                    "critical",
                    subject,
                    f"GPU temperature: {gpu.temperature_c:.0f} C "
                    f"(critical at {t.gpu_temp_crit_c:.0f})",
                    name,
                )
            )
        elif gpu.temperature_c is not None and gpu.temperature_c >= t.gpu_temp_warn_c:
            out.append(
                Alert(
                    "warning",
                    subject,
                    f"GPU temperature: {gpu.temperature_c:.0f} C "
                    f"(warning at {t.gpu_temp_warn_c:.0f})",
                    name,
                )
            )
        if gpu.ecc_uncorrected:
            out.append(
                Alert(
                    "critical",
                    subject,
                    f"ECC: {gpu.ecc_uncorrected} volatile uncorrected errors",
                    name,
                )
            )
        if gpu.xid_events:
            last = gpu.xid_events[-1]
            out.append(
                Alert("critical", subject, f"XID: {last.xid} ({len(gpu.xid_events)} recent)", name)
            )
        if gpu.remapped_rows and gpu.remapped_rows.get("failure"):
            out.append(Alert("critical", subject, "row remapping: failure", name))
    for trt in snap.trt_engines:
        if trt.state == "stale":
            why = "; ".join(trt.reasons)
            out.append(
                Alert("warning", f"{name}/{trt.deployment}", f"REBUILD REQUIRED: {why}", name)
            )
    return out


def deployment_alerts(
    fleet: Fleet, models: dict[str, Model], row: DeploymentRow, history: History | None
) -> Iterable[Alert]:
    """A deployment's engine not ready, over its SLO, its KV cache nearly full, its queue
    growing. `models` is the fleet's models by name."""
    t = fleet.thresholds
    # Deployment ids are unique in the fleet; an undeclared engine is named by its node.
    subject = row.id or f"{row.node}/{row.engine_id}"
    if row.id and row.state == "unknown" and row.reason == NOT_REPORTED:
        yield Alert(
            "warning",
            subject,
            f"not reported by the agent on {row.node} (is it in that agent's fleet file?)",
            row.node,
        )
    standby = row.weight == 0 and row.state == "down"  # a stopped standby takes no traffic
    if row.id and row.state in ("down", "unhealthy") and not standby:
        yield Alert(
            "critical", subject, f"engine {row.state}: {row.reason or ''}".rstrip(": "), row.node
        )
    stats = row.stats
    if stats is None:
        return
    model = models.get(row.model)
    lat = stats.latency
    checks = (
        ("ttft", "SLO TTFT p95", lat.ttft_s, model.slo.ttft_p95_ms if model else None),
        ("itl", "SLO ITL p95", lat.itl_s, model.slo.itl_p95_ms if model else None),
        ("e2e", "SLO e2e p95", lat.e2e_s, model.slo.e2e_p95_ms if model else None),
    )
    for key, label, pct, limit in checks:
        if row.slo.get(key) == "breach" and limit is not None:
            value = pct.p95_or_mean
            kind = "" if pct.p95 is not None else " (mean)"
            yield Alert(
                "warning",
                subject,
                f"{label}: {_fmt_ms(value or 0)}{kind} over {limit:.0f} ms",
                row.node,
            )
    if row.slo.get("errors") == "breach":
        yield Alert("warning", subject, f"error rate: {stats.error_rate:.1%}", row.node)
    if stats.kv_cache_usage is not None and stats.kv_cache_usage >= t.kv_cache_warn:
        yield Alert("warning", subject, f"KV cache: {stats.kv_cache_usage:.0%} used", row.node)
    waiting_now = stats.requests_waiting
    # Only a queue at least queue_min long now can have been growing: skip the history
    # for every other deployment (most of them, every refresh).
    if history is not None and row.engine_id and (waiting_now or 0) >= t.queue_min:
        rings = history.deployment(row.node, row.engine_id, stats.name)
        if rings is not None:
            waiting = rings["waiting"].tail(t.queue_growth_polls)
            if (
                len(waiting) == t.queue_growth_polls
                and None not in waiting
                and all(b > a for a, b in pairwise(waiting))  # type: ignore[operator]
                and (waiting[-1] or 0) >= t.queue_min
            ):
                yield Alert(
                    "warning",
                    subject,
                    f"queue growing: {waiting[0]:.0f} -> "
                    f"{waiting[-1]:.0f} waiting over {t.queue_growth_polls} polls",
                    row.node,
                )


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # unix seconds
    kind: Literal["raised", "cleared", "action"]
    severity: str
    subject: str
    message: str


class EventLog:
    """Alerts raised and cleared, and operator actions, newest first.

    An alert clears only after it has been absent for `clear_after` updates in a row, so
    a value hovering at its threshold does not fill the log with raise/clear pairs.
    """

    def __init__(self, limit: int = 2000, clear_after: int = 5) -> None:
        self.events: deque[Event] = deque(maxlen=limit)
        self.clear_after = clear_after
        self._active: dict[tuple[str, str], Alert] = {}
        self._absent: dict[tuple[str, str], int] = {}

    def update(self, alerts: list[Alert], now: float | None = None) -> None:
        now = time.time() if now is None else now
        current = {a.key: a for a in alerts}
        for key, alert in current.items():
            self._absent.pop(key, None)
            if key not in self._active:
                self.events.appendleft(
                    Event(now, "raised", alert.severity, alert.subject, alert.message)
                )
            self._active[key] = alert
        for key in [k for k in self._active if k not in current]:
            self._absent[key] = self._absent.get(key, 0) + 1
            if self._absent[key] >= self.clear_after:
                alert = self._active.pop(key)
                del self._absent[key]
                self.events.appendleft(
                    Event(now, "cleared", alert.severity, alert.subject, alert.message)
                )

    def action(self, subject: str, message: str, now: float | None = None) -> None:
        self.events.appendleft(
            Event(time.time() if now is None else now, "action", "info", subject, message)
        )
