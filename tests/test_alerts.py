"""Alerts from thresholds, and the event log an on-call engineer reads back."""

from __future__ import annotations

import time

from console.collect.alerts import Alert, EventLog
from console.collect.collector import NodeState
from console.collect.view import build
from console.core.config import parse_fleet
from console.core.snapshot import Gpu, Host, NodeInfo, Snapshot

FLEET = parse_fleet("""
[fleet]
name = "t"
refresh_s = 1.0
[thresholds]
gpu_temp_warn_c = 80
gpu_temp_crit_c = 90
[[nodes]]
name = "a"
agent = "http://127.0.0.1:1"
[[nodes]]
name = "b"
agent = "http://127.0.0.1:2"
""")


def snapshot(*gpus: Gpu) -> Snapshot:
    return Snapshot(
        node=NodeInfo(name="a", agent_version="0", time=0.0),
        host=Host(),
        gpu_status="ok",
        gpus=list(gpus),
    )


def states(now: float, snap: Snapshot, b_age: float | None) -> dict[str, NodeState]:
    a = NodeState("a", "agent", snapshot=snap, last_ok=now)
    b = NodeState(
        "b",
        "agent",
        snapshot=snap if b_age is not None else None,
        last_ok=None if b_age is None else now - b_age,
        failures=0 if b_age is None else 3,
        error="connection refused",
    )
    return {"a": a, "b": b}


def test_thresholds_raise_alerts_with_their_numbers():
    now = time.monotonic()
    snap = snapshot(
        Gpu(index=0, temperature_c=85), Gpu(index=1, temperature_c=93, ecc_uncorrected=2)
    )
    view = build(FLEET, states(now, snap, b_age=3.0), 1.0, now=now)
    alerts = {(a.subject, a.severity, a.message) for a in view.alerts}
    assert ("a/gpu0", "warning", "GPU temperature: 85 C (warning at 80)") in alerts
    assert ("a/gpu1", "critical", "GPU temperature: 93 C (critical at 90)") in alerts
    assert ("a/gpu1", "critical", "ECC: 2 volatile uncorrected errors") in alerts
    stale = [m for s, sev, m in alerts if s == "b"]
    assert stale == ["node stale: last snapshot 3 s ago (connection refused)"]
    assert view.summary.status == "degraded"
    down = build(FLEET, states(now, snap, b_age=6.0), 1.0, now=now)
    assert any(a.subject == "b" and a.message.startswith("node down") for a in down.alerts)


def test_unknown_values_raise_nothing():
    now = time.monotonic()
    view = build(FLEET, states(now, snapshot(Gpu(index=0)), b_age=0.0), 1.0, now=now)
    assert view.alerts == []
    assert view.summary.status == "healthy"


def test_the_event_log_does_not_flap_at_a_threshold():
    log = EventLog(clear_after=3)
    hot = Alert("warning", "a/gpu0", "GPU temperature: 85 C", "a")
    log.update([hot], now=1)
    for t in range(2, 8):  # hovering: present, absent, present...
        log.update([hot] if t % 2 else [], now=t)
    assert [e.kind for e in log.events] == ["raised"]
    for t in range(8, 11):
        log.update([], now=t)
    assert [e.kind for e in log.events] == ["cleared", "raised"]  # newest first
    log.action("gpu-a1", "vllm.start profile=x by alice", now=12)
    assert log.events[0].kind == "action"
