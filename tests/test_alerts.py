"""Alerts from thresholds, and the event log an on-call engineer reads back."""

from __future__ import annotations

import time

import pytest

from console.collect.sources.collector import NodeState
from console.collect.views.alerts import Alert, AlertTracker, EventLog
from console.collect.views.gateway_view import GatewayDeployment, parse
from console.collect.views.view import build
from console.core import alertrules, slo
from console.core.config.load import parse_fleet
from console.core.snapshot import (
    Engine,
    Gpu,
    Host,
    Latency,
    ModelStats,
    NodeInfo,
    Percentiles,
    Snapshot,
)

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


# ---------------------------------------------------------------------------------------------
# One SLO verdict per deployment (console/core/slo.py), over built inputs

SLO_FLEET = parse_fleet("""
[fleet]
name = "t"
[[nodes]]
name = "a"
agent = "http://127.0.0.1:1"
[[models]]
name = "m"
slo = { ttft_p95_ms = 500, itl_p95_ms = 50, error_rate = 0.02 }
""")
MODEL = SLO_FLEET.models[0]


def stats(ttft: Percentiles, itl: Percentiles | None = None, errors: float | None = 0.0):
    latency = Latency(ttft_s=ttft, itl_s=itl or Percentiles(p95=0.01))
    return ModelStats(name="m", latency=latency, error_rate=errors)


def test_a_mean_or_an_unknown_p95_is_unknown_never_ok():
    """`check` marked Triton deployments SLO-ok from a mean (#13): a mean is no p95."""
    bounds = slo.limits(SLO_FLEET, MODEL)
    mean = slo.judge(bounds, stats(Percentiles(mean=0.075, source="mean")))
    assert mean.level == "unknown" and mean.ok is None and mean.only_means
    assert mean.of("ttft").why == "mean only" and mean.of("ttft").mean == 0.075
    nothing = slo.judge(bounds, stats(Percentiles()))
    assert nothing.level == "unknown" and nothing.of("ttft").why == "no figure"
    assert slo.judge(bounds, None).level == "unknown"
    assert slo.judge(bounds, stats(Percentiles(p95=0.2))).level == "ok"


def at_gateway(figures: dict) -> GatewayDeployment | None:
    """One deployment's figures as the gateway's snapshot carries them, parsed."""
    view = parse({"models": {"m": {"d": figures}}})
    return view.at("m", "d") if view is not None else None


def test_what_clients_feel_at_the_gateway_decides_and_the_engine_only_without_it():
    """A deployment ok at the engine (300 ms) and at 640 ms through the gateway against a
    500 ms SLO is over it (#13); a gateway with no request in its window leaves the
    engine's figure to judge."""
    bounds = slo.limits(SLO_FLEET, MODEL)
    engine = stats(Percentiles(p95=0.3))
    gateway = {"ttft_s": {"p95": 0.64, "count": 40}, "requests": 40, "error_rate": 0.0}
    judged = slo.judge(bounds, engine, at_gateway(gateway))
    assert judged.level == "warning" and judged.ok is False
    ttft = judged.of("ttft")
    assert (ttft.value, ttft.measured_at, round(ttft.times or 0, 2)) == (0.64, "gateway", 1.28)
    idle = {"ttft_s": {"p95": None, "count": 0}, "requests": 0, "error_rate": None}
    assert slo.judge(bounds, engine, at_gateway(idle)).of("ttft").measured_at == "engine"
    # What the gateway sends is outside text: a string, a bool, a NaN are no figures.
    for odd in ("0.9", True, float("nan"), -1.0):
        odd_figures = at_gateway({"ttft_s": {"p95": odd}})
        assert slo.judge(bounds, engine, odd_figures).of("ttft").value == 0.3


@pytest.mark.parametrize(
    ("p95", "level"),
    [(0.5, "ok"), (0.51, "warning"), (1.0, "warning"), (1.01, "critical"), (44.0, "critical")],
)
def test_the_severity_scales_with_the_breach(p95, level):
    """88x the SLO is not a warning: over the limit a warning, past twice it critical."""
    assert alertrules.SLO_CRITICAL_TIMES == 2.0
    bounds = slo.limits(SLO_FLEET, MODEL)
    assert slo.judge(bounds, stats(Percentiles(p95=p95))).level == level


def test_an_alert_says_where_it_was_measured_and_how_far_over():
    now = time.monotonic()
    snap = Snapshot(
        node=NodeInfo(name="a", agent_version="0", time=0.0),
        host=Host(),
        gpu_status="ok",
        engines=[
            Engine(
                id="vllm-1",
                kind="vllm",
                endpoint="http://127.0.0.1:8001",
                state="ready",
                models=[stats(Percentiles(p95=44.0), errors=0.03)],
            )
        ],
    )
    view = build(SLO_FLEET, {"a": NodeState("a", "agent", snapshot=snap, last_ok=now)}, 1.0, now)
    shown = {(a.severity, a.message) for a in view.alerts}
    assert shown == {
        ("critical", "SLO TTFT p95: 44000 ms at the engine, 88x the 500 ms SLO"),
        ("warning", "error rate: 3.0% at the engine, 1.50x the 2.0% SLO"),
    }


# ---------------------------------------------------------------------------------------------
# Hysteresis: raise after the condition held, clear after it has been gone


def queue(node: str = "a") -> Alert:
    return Alert("warning", "m/d1", "queue growing: 3 -> 8 waiting over 5 polls", node,
                 alertrules.QUEUE_GROWING)  # fmt: skip


def kv(node: str = "a") -> Alert:
    return Alert("warning", "m/d1", "KV cache: 97% used", node, alertrules.KV_CACHE)


def test_a_queue_growing_now_and_then_does_not_flap():
    """'queue growing' came and went every 10 s: raised and cleared six times a minute.
    Held to its clear_after_s (60 s), it stays raised while it comes back within that."""
    tracker, log = AlertTracker(), EventLog()
    clear = alertrules.QUEUE_GROWING.clear_after_s
    assert clear == 60
    for t in range(0, 120):  # present 5 s, gone 5 s, for two minutes
        found = [queue()] if t % 10 < 5 else []
        log.update(tracker.update(found, float(t), looked={"a"}), now=float(t))
    assert [e.kind for e in log.events] == ["raised"]
    for t in range(120, 120 + int(clear) + 1):
        log.update(tracker.update([], float(t), looked={"a"}), now=float(t))
    assert [e.kind for e in log.events] == ["cleared", "raised"]


def test_a_reading_raises_only_after_it_held_and_at_once_at_a_first_look():
    """A KV cache over its threshold for 20 s is a blip; for its raise_after_s (30 s) an
    alert. On a node read for the first time it is raised at once: it was there before
    the console came, and hiding it would show green while the console knows better."""
    hold = alertrules.KV_CACHE.raise_after_s
    assert hold == 30
    tracker = AlertTracker()
    assert tracker.update([kv()], 0.0, looked=set()) == [kv()]  # a first look
    watched = AlertTracker()
    for t in range(0, 20):
        assert watched.update([kv()], float(t), looked={"a"}) == []
    assert watched.update([], 20.0, looked={"a"}) == []  # gone: the blip is forgotten
    for t in range(21, 51):
        assert watched.update([kv()], float(t), looked={"a"}) == []
    assert watched.update([kv()], 51.0, looked={"a"}) == [kv()]


def test_a_cleared_event_says_what_cleared_and_how_long_it_lasted():
    """It repeated the breach text ("cleared ... SLO TTFT p95: 1600 ms over 1500 ms")."""
    log = EventLog()
    breach = Alert("warning", "d1", "SLO TTFT p95: 1600 ms at the gateway, 1.07x the 1500 ms SLO")
    log.update([breach], now=100.0)
    log.update([], now=352.0)
    cleared = log.events[0]
    assert cleared.kind == "cleared" and cleared.subject == "d1"
    assert cleared.message == "SLO TTFT p95 cleared after 4 min 12 s"
    assert "1600" not in cleared.message


def test_a_breach_that_turns_critical_is_raised_again():
    log = EventLog()
    log.update([Alert("warning", "d1", "SLO TTFT p95: 600 ms at the engine, 1.20x")], now=1)
    log.update([Alert("critical", "d1", "SLO TTFT p95: 4000 ms at the engine, 8.00x")], now=2)
    log.update([Alert("critical", "d1", "SLO TTFT p95: 4100 ms at the engine, 8.20x")], now=3)
    assert [(e.kind, e.severity) for e in log.events] == [
        ("raised", "critical"),
        ("raised", "warning"),
    ]
