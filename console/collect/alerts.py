"""Alerts from the thresholds in fleet.toml, and the log of alerts raised and cleared.

Raised on: a node down or stale, a GPU over its temperature thresholds, uncorrected ECC
errors or XID events, a deployment over its SLO (p95 TTFT or ITL, e2e, error rate), a
KV cache nearly full, a queue that keeps growing, an engine not ready.

Names, severities, thresholds and comparisons come from console/core/alertrules.py, which
the Prometheus rules of `engineroom rules` read too: the two cannot disagree.
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
from console.core import alertrules as rules
from console.core.config import Fleet, Model
from console.core.snapshot import Snapshot

if TYPE_CHECKING:
    from console.collect.view import DeploymentRow

Severity = rules.Severity
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
        down = rules.NODE_DOWN
        return Alert(down.severity, name, f"{down.title}: {state.error or 'no answer'}", name)
    if status == "stale":
        age = state.age(now) or 0.0
        return Alert(
            rules.NODE_STALE.severity,
            name,
            f"{rules.NODE_STALE.title}: last snapshot {age:.0f} s ago"
            + (f" ({state.error})" if state.error else ""),
            name,
        )
    return None


def snapshot_alerts(fleet: Fleet, name: str, snap: Snapshot) -> list[Alert]:
    """What one node's snapshot says about its GPUs and engines' builds."""
    out: list[Alert] = []

    def add(defn: rules.AlertDef, subject: str, detail: str) -> None:
        out.append(Alert(defn.severity, subject, f"{defn.title}: {detail}", name))

    if snap.gpu_status != "ok" and snap.gpus:
        add(rules.NVML_DOWN, name, snap.gpu_status)
    # The limits once per snapshot, not per GPU: this runs for 1,000 snapshots a second.
    temp_limits = [
        (defn, limit)
        for defn in (rules.GPU_TEMP_CRITICAL, rules.GPU_TEMP_WARNING)  # the worse one only
        if (limit := defn.threshold(fleet)) is not None
    ]
    ecc_limit = rules.GPU_ECC.threshold(fleet)
    for gpu in snap.gpus:
        temp = gpu.temperature_c
        if temp is not None:
            for defn, limit in temp_limits:
                if defn.exceeds(temp, limit):
                    detail = f"{temp:.0f} C ({defn.severity} at {limit:.0f})"
                    add(defn, f"{name}/gpu{gpu.index}", detail)
                    break
        if gpu.ecc_uncorrected is not None and rules.GPU_ECC.exceeds(
            gpu.ecc_uncorrected, ecc_limit
        ):
            detail = f"{gpu.ecc_uncorrected} volatile uncorrected errors"
            add(rules.GPU_ECC, f"{name}/gpu{gpu.index}", detail)
        if gpu.xid_events:
            last = gpu.xid_events[-1]
            detail = f"{last.xid} ({len(gpu.xid_events)} recent)"
            add(rules.GPU_XID, f"{name}/gpu{gpu.index}", detail)
        if gpu.remapped_rows and gpu.remapped_rows.get("failure"):
            add(rules.GPU_ROW_REMAP, f"{name}/gpu{gpu.index}", "failure")
    for trt in snap.trt_engines:
        if trt.state == "stale":
            add(rules.REBUILD_REQUIRED, f"{name}/{trt.deployment}", "; ".join(trt.reasons))
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
        defn = rules.ENGINE_DOWN if row.state == "down" else rules.ENGINE_UNHEALTHY
        yield Alert(
            defn.severity, subject, f"{defn.title}: {row.reason or ''}".rstrip(": "), row.node
        )
    stats = row.stats
    if stats is None:
        return
    model = models.get(row.model)
    lat = stats.latency
    checks = (
        (rules.SLO_TTFT, lat.ttft_s),
        (rules.SLO_ITL, lat.itl_s),
        (rules.SLO_E2E, lat.e2e_s),
    )
    for defn, pct in checks:
        value = pct.p95_or_mean
        if value is None:  # unknown never alerts (20,000 deployments on a first look)
            continue
        limit = defn.threshold(fleet, model)
        if defn.exceeds(value, limit):
            kind = "" if pct.p95 is not None else " (mean)"
            yield Alert(
                defn.severity,
                subject,
                f"{defn.title}: {_fmt_ms(value)}{kind} over {_fmt_ms(limit or 0)}",
                row.node,
            )
    if stats.error_rate is not None and rules.ERROR_RATE.exceeds(
        stats.error_rate, rules.ERROR_RATE.threshold(fleet, model)
    ):
        yield Alert(
            rules.ERROR_RATE.severity,
            subject,
            f"{rules.ERROR_RATE.title}: {stats.error_rate:.1%}",
            row.node,
        )
    kv = rules.KV_CACHE
    if stats.kv_cache_usage is not None and kv.exceeds(stats.kv_cache_usage, kv.threshold(fleet)):
        yield Alert(kv.severity, subject, f"{kv.title}: {stats.kv_cache_usage:.0%} used", row.node)
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
                    rules.QUEUE_GROWING.severity,
                    subject,
                    f"{rules.QUEUE_GROWING.title}: {waiting[0]:.0f} -> "
                    f"{waiting[-1]:.0f} waiting over {t.queue_growth_polls} polls",
                    row.node,
                )


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # unix seconds
    kind: Literal["raised", "active", "cleared", "action"]  # active: raised before a recording
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
        self.add(Event(time.time() if now is None else now, "action", "info", subject, message))

    def add(self, event: Event) -> None:
        """An event in its place by its time, newest first: an operator action is seen
        after it happened (a job at the next snapshot, an audit row at the next read).
        One older than every event kept is not kept."""
        events = self.events
        i = 0
        while i < len(events) and events[i].time > event.time:  # actions are few: a walk
            i += 1
        if len(events) == events.maxlen:
            if i == len(events):
                return
            events.pop()
        events.insert(i, event)
