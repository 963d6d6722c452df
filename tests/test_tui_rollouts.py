"""The Rollouts screen against a real gateway holding a real rollout record (issue 31).

A real rollout cheaply: a restart of tiny's two deployments, whose endpoints and agent are
closed ports. The gateway runs it for real: step 1's baseline window sends its canaries to
tiny-a (refused at once), then the drain finds no other deployment ready to take tiny-a's
traffic (tiny-b's health check is refused too): the rollout halts at step 1, in its drain
phase, with why. The console shows it; a viewer token's console shows the keys
dimmed and asks nothing; the web view refuses the key; an admin's abort asks a
confirmation naming the rollout, and the gateway then reads it aborted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from console.core.config import parse_fleet
from console.core.rollout import Ask, make_plan
from console.core.rollout_plan import to_data
from console.tui.app import EngineroomApp
from console.tui.screens.rollouts import RolloutsScreen
from console.tui.web import WebViewApp
from console.tui.widgets.confirm import ConfirmScreen
from console.tui.widgets.safe_static import SafeStatic
from console.tui.workflows import STEER_WHY
from tests.engines.servers import free_port, stop, wait_until
from tests.test_gateway import ADMIN, GATEWAY_VIEWER, Gateway, start_gateway
from tests.test_replay import replay_app, write_incident
from tests.tui_support import until

SIZE = (120, 50)
TOKEN_ENV = "ENGINEROOM_ADMIN_TOKEN"  # the gateway's default; tests/test_gateway sets it


def fleet_text(tmp_path: Path, gw_port: int) -> str:
    closed = [free_port() for _ in range(3)]  # nothing listens: each call is refused at once
    deployments = "".join(
        f"""
  [[models.deployments]]
  id = "tiny-{name}"
  node = "local"
  engine = "vllm"
  endpoint = "http://127.0.0.1:{port}"
  weight = 50
"""
        for name, port in zip("ab", closed[1:], strict=True)
    )
    return f"""
[fleet]
name = "roll"
refresh_s = 0.5
[gateway]
url = "http://127.0.0.1:{gw_port}"
state_dir = "{tmp_path / "gw-state"}"
health_interval_s = 0.5
[[nodes]]
name = "local"
agent = "http://127.0.0.1:{closed[0]}"
[[models]]
name = "tiny"
slo = {{ ttft_p95_ms = 500, itl_p95_ms = 60 }}
failover = {{ steps = [100], verify_s = 0.5, warmup_requests = 0, drain_timeout_s = 5 }}
{deployments}
"""


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
        await until(pilot, lambda: app.gateway_role == "admin", what="the gateway's role")
        await pilot.press("A")
        confirm = await until(
            pilot, lambda: app.screen if isinstance(app.screen, ConfirmScreen) else None,
            what="the confirmation",
        )  # fmt: skip
        assert confirm.title_text == f"Abort rollout {rid} (restart, step 1 of 2: tiny-a)?"
        await pilot.press("y")
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
