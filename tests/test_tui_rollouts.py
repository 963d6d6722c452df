"""The Rollouts screen against a real gateway holding a real rollout record (issue 31).

A real rollout cheaply: a restart of tiny's two deployments, whose endpoints and agent are
closed ports. The gateway runs it for real: step 1's baseline window sends its canaries to
tiny-a (refused at once), then the drain finds no other deployment ready to take tiny-a's
traffic (tiny-b's health check is refused too): the rollout halts at step 1, in its drain
phase, with why. The console shows it, with tiny's capacity below what the plan keeps and
its p95s beside their baselines (none measured: "?"); a viewer token's console shows the
keys dimmed and asks nothing; the web view refuses the key; an admin's resume asks a
confirmation naming the rollout and records the why typed in it (seen as it is typed),
and an abort left without a why records the console's fixed one; the gateway then reads
it aborted.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
from textual.widgets import Input

from console.collect.sources.source import NodeState
from console.collect.views.view import build
from console.core.config.load import parse_fleet
from console.core.gateway_wire import RolloutRecord
from console.core.rollouts.plan_file import to_data
from console.core.rollouts.planner import Ask, make_plan
from console.core.snapshot import Percentiles, decode_snapshot
from console.tui import format as fmt
from console.tui.app import EngineroomApp
from console.tui.screens.rollouts import RolloutsScreen
from console.tui.screens.rollouttext import rollout_text
from console.tui.web.session import WebViewApp
from console.tui.widgets.confirm import ConfirmScreen, WhyConfirmScreen
from console.tui.widgets.safe_static import SafeStatic
from console.tui.workflows import STEER_WHY
from tests.engines.servers import free_port, stop, wait_until
from tests.support.fleet import deployment, gateway_fleet
from tests.test_gateway import ADMIN, GATEWAY_VIEWER, Gateway, start_gateway
from tests.test_replay import replay_app, write_incident
from tests.tui_support import CPU, FLEET, keys, on_top, until

SIZE = (120, 50)
TOKEN_ENV = "ENGINEROOM_ADMIN_TOKEN"  # the gateway's default; tests/test_gateway sets it


def fleet_text(tmp_path: Path, gw_port: int) -> str:
    """tiny-a and tiny-b, and the node's agent, on closed ports: each call is refused."""
    deps = [deployment(f"tiny-{x}", "local", "vllm", free_port(), weight=50) for x in "ab"]
    return gateway_fleet(
        "roll", gw_port, tmp_path / "gw-state", {"tiny": deps},
        agent=f"http://127.0.0.1:{free_port()}", fleet={"refresh_s": 0.5},
        model={"slo": {"ttft_p95_ms": 500, "itl_p95_ms": 60},
               "failover": {"steps": [100], "verify_s": 0.5, "warmup_requests": 0,
                            "drain_timeout_s": 5}},
    )  # fmt: skip


@pytest.fixture
def halted(tmp_path: Path):
    """(fleet text, the gateway, the halted rollout's record)."""
    port = free_port()
    text = fleet_text(tmp_path, port)
    gateway = start_gateway(tmp_path, text, port, healthy=False)
    try:
        plan = to_data(make_plan(parse_fleet(text), Ask(operation="restart", models=["tiny"])))
        body = {"plan": plan, "who": "alice", "why": "kernel 6.8 on \x1b[31mlocal"}
        started = gateway.admin("POST", "/admin/rollouts", json=body)
        assert started.status_code in (200, 201, 202), started.text
        rid = started.json()["id"]
        record = wait_until(lambda: _halted(gateway, rid), 20, what="the rollout halted")
        yield text, gateway, record
    finally:
        stop(gateway.process, grace=5)


def _halted(gateway: Gateway, rid: str) -> dict | None:
    record = gateway.admin("GET", f"/admin/rollouts/{rid}").json()
    return record if record["status"] == "halted" else None


def _event(gateway: Gateway, rid: str, what: str) -> dict | None:
    events = gateway.admin("GET", f"/admin/rollouts/{rid}").json()["events"]
    return next((e for e in reversed(events) if e["what"] == what), None)


def shown(app: EngineroomApp) -> str:
    return str(app.screen.query_one("#rollout", SafeStatic).render())


async def on_rollouts(app: EngineroomApp, pilot, rid: str) -> str:
    await pilot.press("o")
    await until(pilot, lambda: isinstance(app.screen, RolloutsScreen), what="Rollouts")
    return await until(
        pilot, lambda: rid in shown(app) and "HALTED" in shown(app) and shown(app),
        what="the halted rollout on screen",
    )  # fmt: skip


async def test_a_halted_rollout_is_shown_with_why_and_an_abort_names_it(
    halted, monkeypatch: pytest.MonkeyPatch
):
    text, gateway, record = halted
    rid = record["id"]
    step = record["steps"][0]
    assert (step["deployment"], step["state"], step["phase"]) == ("tiny-a", "halted", "drain")

    # A viewer token: the screen shows the rollout; its keys are dimmed and ask nothing.
    monkeypatch.setenv(TOKEN_ENV, GATEWAY_VIEWER)
    app = EngineroomApp(parse_fleet(text))
    async with app.run_test(size=SIZE) as pilot:
        await on_rollouts(app, pilot, rid)
        await until(pilot, lambda: app.gateway_role == "viewer", what="the gateway's role")
        await until(pilot, lambda: "viewer token" in shown(app), what="why the keys are off")
        await pilot.press("A")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen), "a viewer was asked to abort"
        assert app.screen.check_action("abort_rollout", ()) is None  # shown, dimmed

    # The web view (read-only): the key is refused, and said to be.
    web = WebViewApp(parse_fleet(text))
    async with web.run_test(size=SIZE) as pilot:
        await on_rollouts(web, pilot, rid)
        await pilot.press("A")
        await until(pilot, lambda: "aborting a rollout" in web.refused, what="the refusal")
        assert not isinstance(web.screen, ConfirmScreen)
        # Whatever reaches its one way to the gateway: what acts is refused there too.
        abort = await web.gateway_call(lambda g: g.rollout_steer(rid, "abort", "x", "y"), "abort")
        assert abort is None and web.refused[-1] == "a call to the gateway (abort)", web.refused
    assert gateway.admin("GET", f"/admin/rollouts/{rid}").json()["status"] == "halted"

    # An admin's console: where it stopped and why, then an abort named and confirmed.
    monkeypatch.setenv(TOKEN_ENV, ADMIN)
    app = EngineroomApp(parse_fleet(text))
    async with app.run_test(size=SIZE) as pilot:
        screen = await on_rollouts(app, pilot, rid)
        assert "step 1 of 2, wave 1: tiny-a (tiny on local)  halted, phase drain" in screen
        assert f"HALTED: {record['error']}" in screen, screen  # why, whole
        assert record["error"].startswith("step 1 (tiny-a): drain: ")
        assert "by alice" in screen
        assert "why: kernel 6.8 on \\x1b[31mlocal" in screen  # outside text, made safe
        assert "\x1b" not in screen
        # Nothing was measured: unknown, never 0.
        assert "▶1  tiny-a" in screen and "?→?" in screen, screen
        assert "TTFT p95  baseline ?  now ? (not measured since its baseline)" in screen
        assert "ITL p95   baseline ?  now ? (not measured since its baseline)" in screen
        # Both of tiny's deployments checked and down: 0 is known, and below the floor.
        await until(pilot, lambda: "tiny: 0 of 2 ready" in shown(app), what="tiny's capacity")
        assert ("capacity now (the plan takes 1 out at most per model)\n  tiny: 0 of 2 ready "
                "and in rotation, the plan keeps 1: below it") in shown(app)  # fmt: skip
        await until(pilot, lambda: app.gateway_role == "admin", what="the gateway's role")

        # A resume, its why typed in the confirmation (and seen as it is typed): it halts
        # again at the same drain.
        await pilot.press("r")
        confirm = await on_top(pilot, app, WhyConfirmScreen, what="the resume's confirmation")
        assert confirm.title_text == f"Resume rollout {rid} (restart, step 1 of 2: tiny-a)?"
        typed = "tiny-b is back: try again"
        await pilot.press(*keys(typed))
        field = confirm.query_one("#why", Input)
        await until(pilot, lambda: typed in field.render_line(0).text, what="the why on screen")
        await pilot.press("enter")
        resumed = await until(pilot, lambda: _event(gateway, rid, "resumed"), what="resumed")
        assert resumed["why"] == typed, resumed
        await until(pilot, lambda: _halted(gateway, rid), what="halted again")
        await until(pilot, lambda: typed in shown(app) and "HALTED" in shown(app),
                    what="the resume's why among the events, halted again")  # fmt: skip

        await pilot.press("A")
        confirm = await on_top(pilot, app, ConfirmScreen, what="the confirmation")
        assert confirm.title_text == f"Abort rollout {rid} (restart, step 1 of 2: tiny-a)?"
        await pilot.press("enter")  # no why typed: the console's own
        await until(pilot, lambda: "ABORTED" in shown(app), what="aborted on screen")
    after = await asyncio.to_thread(gateway.admin, "GET", f"/admin/rollouts/{rid}")
    assert after.json()["status"] == "aborted"
    said = after.json()["events"][-1]
    assert said["what"] == "aborted" and said["why"] == STEER_WHY, said


async def test_a_replay_shows_the_screen_and_refuses_its_keys(tmp_path: Path):
    app = replay_app(write_incident(tmp_path / "incident.rec"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen), what="Rollouts")
        await until(pilot, lambda: "a replay: the gateway is not asked" in shown(app),
                    what="the screen saying it is a replay")  # fmt: skip
        await pilot.press("p", "r", "A")
        await until(pilot, lambda: len(app.refused) == 3, what="the three refusals")
        assert app.refused == ["pausing a rollout", "resuming a rollout", "aborting a rollout"]
        assert isinstance(app.screen, RolloutsScreen)


def _record(current: str, **figures: dict) -> dict:
    """A rollout of tiny's two recorded deployments as the console reads it (through the
    wire model), `current`'s turn under way in its operation, with `figures`."""
    steps = [
        {"model": "tiny", "deployment": dep, "node": "cpu-1", "operation": "restart",
         "wave": n, "state": "running" if dep == current else "pending",
         "phase": "operation" if dep == current else None,
         **(figures if dep == current else {})}
        for n, dep in enumerate(("tiny-vllm", "tiny-trt"), 1)
    ]  # fmt: skip
    record = {"id": "ab12", "who": "alice", "status": "running", "operation": "restart",
              "current": 0 if current == "tiny-vllm" else 1, "steps": steps}  # fmt: skip
    return RolloutRecord.model_validate(record).model_dump()


def test_the_step_under_way_shows_its_latest_p95s_with_where_from_never_a_mean():
    """Beside the baseline: the figure after its turn when the rollout measured one, else
    the console's latest reading (the engine's histogram p95, named), else "?". Triton
    here gives TTFT as a mean only: no p95, and the mean is not shown as one."""
    snap = decode_snapshot(CPU.read_text())
    triton = next(e for e in snap.engines if e.kind == "triton")
    mean_only = Percentiles(mean=0.0777, count=8.0, source="mean")
    latency = msgspec.structs.replace(triton.models[0].latency, ttft_s=mean_only)
    triton.models[0] = msgspec.structs.replace(triton.models[0], latency=latency)
    now = time.monotonic()
    view = build(parse_fleet(FLEET), {"cpu-1": NodeState("cpu-1", "agent", snapshot=snap,
                                                         last_ok=now)}, 1.0, now)  # fmt: skip
    baseline = {"ttft_p95_s": 0.5, "itl_p95_s": 0.02, "source": "a window under traffic"}
    canaries = {"ttft_p95_s": 0.04, "itl_p95_s": None, "source": "20 canaries straight to it"}

    # vLLM: its histograms' p95s, with where from.
    text = rollout_text([_record("tiny-vllm", baseline=baseline, canary_baseline=canaries)],
                        view=view).plain  # fmt: skip
    assert ("TTFT p95  baseline 40ms (baseline, canaries)  now 32ms (latest: its engine's "
            "metrics, over 2.08s)") in text, text  # fmt: skip
    assert "ITL p95   baseline 20ms (baseline, serving)  now 10ms (latest: its engine's" in text
    # Without the console's view: unknown.
    text = rollout_text([_record("tiny-vllm", baseline=baseline)]).plain
    assert "TTFT p95  baseline 500ms (baseline, serving)  now ? (not measured since" in text

    # Triton: a mean only, said so; never shown as the p95.
    text = rollout_text([_record("tiny-trt", baseline=baseline)], view=view).plain
    assert ("TTFT p95  baseline 500ms (baseline, serving)  now ? (its engine gives only a "
            "mean, no p95)") in text, text  # fmt: skip
    assert fmt.seconds(0.0777) not in text

    # Measured after its operation: that figure, not the console's.
    verified = {"ttft_p95_s": 0.045, "itl_p95_s": None, "source": "20 canaries"}
    text = rollout_text([_record("tiny-vllm", baseline=baseline, canary_baseline=canaries,
                                 verified=verified)], view=view).plain  # fmt: skip
    assert "TTFT p95  baseline 40ms (baseline, canaries)  now 45ms (after its operation)" in text
