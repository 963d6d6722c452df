"""Alerts from the thresholds in fleet.toml, and the log of alerts raised and cleared.

Raised on: a node down or stale, a GPU over its temperature thresholds, uncorrected ECC
errors or XID events, a deployment over its SLO (p95 TTFT or ITL, e2e, error rate), a
KV cache nearly full, a queue that keeps growing, an engine not ready.

Names, severities, thresholds, comparisons and holds come from console/core/alertrules.py,
which the Prometheus rules of `engineroom rules` read too: the two cannot disagree. A
deployment's SLO alerts are its one verdict's (console/core/slo.py), which Models and
`check` show. AlertTracker holds what a build finds (the conditions) to each alert's
hysteresis; EventLog writes down what the tracker raised and cleared.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

from console.collect.sources.collector import NodeState, NodeStatus
from console.collect.views.deployments import NOT_REPORTED, DeploymentRow
from console.collect.views.history import History
from console.core import alertrules as rules
from console.core.config.load import Fleet
from console.core.slo import FIGURES, Judged, times_text
from console.core.snapshot import Snapshot
from console.core.units import ms_from_seconds

Severity = rules.Severity


@dataclass(frozen=True, slots=True)
class Alert:
    severity: Severity
    subject: str  # what it is about: "gpu-a1", "gpu-a1/gpu3", "llama-8b/llama8b-trt"
    message: str
    node: str | None = None
    # Its definition, for the holds (None: the console's own, raised and cleared at once).
    rule: rules.AlertDef | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.subject, self.title)

    @property
    def title(self) -> str:
        return self.message.split(":", 1)[0]


def _ratio(value: float) -> str:
    return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"


def slo_alert(judged: Judged, subject: str, node: str | None) -> Alert:
    """A figure over its SLO, worded with where it was measured and by how much:
    "SLO TTFT p95: 640 ms at the gateway, 1.3x the 500 ms SLO"."""
    defn = FIGURES[judged.figure]
    value, limit = judged.value or 0.0, judged.limit or 0.0
    shown = (_ratio(value), _ratio(limit)) if judged.figure == "errors" else (
        ms_from_seconds(value), ms_from_seconds(limit))  # fmt: skip
    scale = times_text(judged.times)
    severity: Severity = "critical" if judged.level == "critical" else defn.severity
    return Alert(
        severity,
        subject,
        f"{defn.title}: {shown[0]} at the {judged.measured_at}, {scale} the {shown[1]} SLO",
        node,
        defn,
    )


def status_alert(name: str, state: NodeState, status: NodeStatus, now: float) -> Alert | None:
    """A node down or stale: its own alert, worded with its error and age."""
    if status == "down":
        down = rules.NODE_DOWN
        detail = f"{down.title}: {state.error or 'no answer'}"
        return Alert(down.severity, name, detail, name, down)
    if status == "stale":
        age = state.age(now) or 0.0
        return Alert(
            rules.NODE_STALE.severity,
            name,
            f"{rules.NODE_STALE.title}: last snapshot {age:.0f} s ago"
            + (f" ({state.error})" if state.error else ""),
            name,
            rules.NODE_STALE,
        )
    return None


def snapshot_alerts(fleet: Fleet, name: str, snap: Snapshot) -> list[Alert]:
    """What one node's snapshot says about its GPUs and engines' builds."""
    out: list[Alert] = []

    def add(defn: rules.AlertDef, subject: str, detail: str) -> None:
        out.append(Alert(defn.severity, subject, f"{defn.title}: {detail}", name, defn))

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


def deployment_alerts(fleet: Fleet, row: DeploymentRow, history: History | None) -> Iterable[Alert]:
    """A deployment's engine not ready, over its SLO (its verdict's figures), its KV cache
    nearly full, its queue growing."""
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
        detail = f"{defn.title}: {row.reason or ''}".rstrip(": ")
        yield Alert(defn.severity, subject, detail, row.node, defn)
    stats = row.stats
    if row.verdict.level in ("warning", "critical"):  # the SLO, judged once (core/slo.py)
        for judged in row.verdict.figures:
            if judged.level in ("warning", "critical"):
                yield slo_alert(judged, subject, row.node)
    if stats is None:
        return
    kv = rules.KV_CACHE
    if stats.kv_cache_usage is not None and kv.exceeds(stats.kv_cache_usage, kv.threshold(fleet)):
        detail = f"{kv.title}: {stats.kv_cache_usage:.0%} used"
        yield Alert(kv.severity, subject, detail, row.node, kv)
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
                    rules.QUEUE_GROWING,
                )


class AlertTracker:
    """The alerts raised now, from the conditions each build finds, with each alert's
    hysteresis (console/core/alertrules.py: raise_after_s, clear_after_s).

    A condition is raised once it has held its rule's raise_after_s, or at once when its
    node is at its first look (it was there before this console came: "active at start",
    and a console that hid it for half a minute would be green while it knows better). A
    raised alert stays, worded as last seen, until its condition has been gone for
    clear_after_s. Its severity follows the condition's while it holds (a breach that
    grows to critical is critical now). Costs a dict lookup per condition and per alert
    raised, never a walk of the fleet."""

    def __init__(self) -> None:
        self._since: dict[tuple[str, str], float] = {}  # held, not raised yet: first seen
        self._active: dict[tuple[str, str], Alert] = {}  # raised, in the order raised
        self._gone: dict[tuple[str, str], float] = {}  # raised, its condition gone since

    def update(self, conditions: list[Alert], now: float, looked: Container[str]) -> list[Alert]:
        """The alerts raised as of `now` (monotonic seconds). `looked`: the nodes seen
        before this build; a condition on any other node is at its first look."""
        since, active, gone = self._since, self._active, self._gone
        present: set[tuple[str, str]] = set()
        for alert in conditions:
            key = alert.key
            present.add(key)
            if key in active:
                active[key] = alert
                gone.pop(key, None)
                continue
            hold = alert.rule.raise_after_s if alert.rule is not None else 0.0
            first = since.setdefault(key, now)
            if hold <= 0 or now - first >= hold or alert.node is None or alert.node not in looked:
                del since[key]
                active[key] = alert
        for key in [k for k in since if k not in present]:  # a blip shorter than its hold
            del since[key]
        if len(present) < len(active):
            for key, alert in list(active.items()):
                if key in present:
                    continue
                left = gone.setdefault(key, now)
                clear = alert.rule.clear_after_s if alert.rule is not None else 0.0
                if now - left >= clear:
                    del active[key], gone[key]
        return list(active.values())


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # unix seconds
    kind: Literal["raised", "active", "cleared", "action"]  # active: raised before a recording
    severity: str
    subject: str
    message: str


class EventLog:
    """Alerts raised and cleared, and operator actions, newest first.

    Its alerts are a tracker's (AlertTracker: the holds of console/core/alertrules.py),
    so it writes down each change as it comes; `clear_after` (updates) only holds back
    the clearing of alerts from a source without holds. A cleared event says what cleared
    and how long it lasted, never the breach text again; an alert that turns critical
    while raised is raised again, critical.
    """

    def __init__(self, limit: int = 2000, clear_after: int = 1) -> None:
        self.events: deque[Event] = deque(maxlen=limit)
        self.clear_after = clear_after
        self._active: dict[tuple[str, str], tuple[Alert, float]] = {}  # and when raised
        self._absent: dict[tuple[str, str], int] = {}

    def update(self, alerts: list[Alert], now: float | None = None) -> None:
        now = time.time() if now is None else now
        current = {a.key: a for a in alerts}
        for key, alert in current.items():
            self._absent.pop(key, None)
            was = self._active.get(key)
            escalated = (
                was is not None and alert.severity == "critical" and was[0].severity != "critical"
            )
            if was is None or escalated:
                self.events.appendleft(
                    Event(now, "raised", alert.severity, alert.subject, alert.message)
                )
            self._active[key] = (alert, now if was is None else was[1])
        for key in [k for k in self._active if k not in current]:
            self._absent[key] = self._absent.get(key, 0) + 1
            if self._absent[key] >= self.clear_after:
                alert, raised = self._active.pop(key)
                del self._absent[key]
                message = f"{alert.title} cleared after {lasted(now - raised)}"
                self.events.appendleft(
                    Event(now, "cleared", alert.severity, alert.subject, message)
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


def lasted(seconds: float) -> str:
    """How long an alert lasted: "8 s", "4 min 12 s", "2 h 5 min"."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
