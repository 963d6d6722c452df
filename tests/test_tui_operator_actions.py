"""Operator actions on the live console, against a real agent and a real gateway.

An operator starts vLLM on a node (an agent job) and fails a model over (a gateway job):
the console's Events lists both, with who, what, target, state and time, as a replay of
a recording would; its Jobs lists the gateway's failover beside the agent's job, and
Enter on the failover opens its steps (issue 28, defect 5). The playbook reads the same
gateway: its live weights, not fleet.toml's, decide whether the traffic moved, and Enter
on "fail over to vLLM" opens the plan to the standby it names (defect 6).

The profile's command is this test's own python, which has no vLLM: the start job fails
in seconds with the engine's real error. The gateway's deployments do not answer, so the
emergency failover fails its readiness check: both are real jobs, ended, in seconds.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest
from textual.widgets import Button, Input, Select

from console.core.config.load import parse_fleet
from console.tui.app import EngineroomApp
from console.tui.screens.drills import PlaybookScreen
from console.tui.screens.events import EventsScreen
from console.tui.screens.failover import FailoverScreen
from console.tui.screens.jobs import GatewayJobScreen, JobsScreen
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable
from tests.conftest import OPERATOR
from tests.engines.servers import free_port, stop
from tests.support.fleet import (
    agent_and_gateway_tables,
    deployment,
    fleet_toml,
    model_dir,
    vllm_profile,
)
from tests.support.playbook import playbook_console
from tests.test_hardening_clients import ADMIN, start_gateway
from tests.tui_support import until

SIZE = (160, 40)
# Events' message cell holds the whole line of a job whose every step was seen changing:
# "by alice: job ID vllm.start tiny failed: preflight succeeded, spawn succeeded: load:
# the engine exited ..." is 155 characters; at 160 columns the cell is about 108 wide.
# (Who acted comes first, so a narrower screen cuts the steps, never the name.)
EVENTS_SIZE = (220, 40)
OPERATOR_TOKEN = OPERATOR.split(":", 1)[1]


def rows(app: EngineroomApp) -> dict[str, list[str]]:
    """The screen's table: each row's cells as plain text, by key."""
    table = app.screen.query_one(FleetTable)
    return {key: [str(getattr(c, "plain", c)) for c in row.made()] for key, row in
            table.rows_by_key.items()}  # fmt: skip


@pytest.fixture
def agent_and_gateway(agent_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    agent_port, gw_port, port = free_port(), free_port(), free_port()
    text = fleet_toml(
        fleet={"name": "actions", "refresh_s": 0.5},
        **agent_and_gateway_tables(tmp_path / "state", gw_port, tmp_path / "gw-state"),
        nodes=[{"name": "local", "agent": f"http://127.0.0.1:{agent_port}",
                "token_env": "T_OPERATOR"}],
        profiles={"tiny": vllm_profile("local", model_dir(tmp_path), port, sys.executable)},
        models=[{"name": "tiny", "deployments": [
            deployment("tiny-trt", "local", "triton", free_port(), engine_model="ensemble",
                       weight=100),
            deployment("tiny-vllm", "local", "vllm", port, weight=0, profile="tiny"),
        ]}],
    )  # fmt: skip
    agent = agent_factory(text, port=agent_port)
    gateway = start_gateway(agent.fleet, gw_port)
    monkeypatch.setenv("T_OPERATOR", OPERATOR_TOKEN)
    monkeypatch.setenv("T_ADMIN", ADMIN)
    yield text, agent, gateway
    stop(gateway.process, grace=5)


async def test_a_vllm_start_and_a_failover_show_on_events_and_jobs(agent_and_gateway):
    text, agent, gateway = agent_and_gateway
    app = EngineroomApp(parse_fleet(text))
    async with app.run_test(size=EVENTS_SIZE) as pilot:
        await pilot.press("v")
        await until(pilot, lambda: isinstance(app.screen, EventsScreen), what="Events")
        await until(pilot, lambda: app.gateway_snapshot, what="the gateway read")

        # The actions, taken as another operator's console takes them.
        started = await asyncio.to_thread(
            httpx.post,
            agent.url + "/v1/jobs",
            json={"kind": "vllm.start", "profile": "tiny", "overrides": {}},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            timeout=10,
        )
        assert started.status_code == 202, started.text
        start = started.json()["id"]
        why = {"model": "tiny", "to": "tiny-vllm", "mode": "emergency", "why": "trt is stale"}
        asked = await asyncio.to_thread(gateway.admin, "POST", "/admin/failover", json=why)
        assert asked.status_code == 202, asked.text
        failover = asked.json()["id"]

        def line(*parts: str) -> list[str] | None:
            return next(
                (r for r in rows(app).values() if all(p in " | ".join(r) for p in parts)), None
            )

        # The agent's job: node, kind, target, state, who; its time is the job's.
        agent_row = await until(
            pilot,
            lambda: line(f"by alice: job {start} vllm.start tiny failed"),
            # The failure was seen as it happened ("running", then "failed") or only at
            # its end: the line says the same, whole at this width (it was cut once).
            timeout=60,
            what="the vLLM start, ended, on Events",
        )
        assert agent_row[1:3] == ["action", "local"]
        assert "load: the engine exited with code 1" in agent_row[3]
        # The gateway's failover: created and ended, with its target, who and why.
        created = (
            f"gateway: job failover.emergency created: to tiny-vllm (emergency), job {failover}"
        )
        ended = f"gateway: job failover.emergency failed: to tiny-vllm (emergency), job {failover}"
        assert await until(
            pilot, lambda: line(f"by admin: {created} (trt is stale)"), what="the failover created"
        )
        gateway_row = await until(
            pilot,
            lambda: line(f"by admin: {ended} (trt is stale)"),
            timeout=30,
            what="the failover ended",
        )
        assert gateway_row[1:3] == ["action", "tiny"]

        await pilot.press("j")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), what="Jobs")
        key = f"@gateway/{failover}"
        listed = await until(
            pilot,
            lambda: rows(app) if key in rows(app) and f"local/{start}" in rows(app) else None,
            what="the agent's job and the gateway's failover on Jobs",
        )
        node, job_id, kind, target, state, _, who, _ = listed[key]
        assert (node, job_id, kind, target, state, who) == (
            "gateway", failover, "failover.emergency", "tiny-vllm", "failed", "admin",
        )  # fmt: skip
        assert listed[f"local/{start}"][2:5] == ["vllm.start", "tiny", "failed"]

        table = app.screen.query_one(FleetTable)
        table.focus()
        table.move_cursor(row=table.get_row_index(key))
        await pilot.press("enter")
        screen = await until(
            pilot,
            lambda: app.screen if isinstance(app.screen, GatewayJobScreen) else None,
            what="the failover job's screen",
        )
        await until(pilot, lambda: screen.job, what="the failover job read from the gateway")
        info = str(screen.query_one("#job-info").render())
        assert "failover.emergency tiny-vllm on gateway" in info and "FAILED" in info
        steps = await until(pilot, lambda: rows(app) or None, what="its steps")
        assert steps["readiness"][1] == "failed"


# -- the playbook over the gateway's live weights ------------------------------------------


async def test_the_gateways_live_weights_make_the_failover_step_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("T_ADMIN", ADMIN)
    with playbook_console(tmp_path) as (app, gateway):
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.gateway_snapshot, what="the gateway read")
            app.open_playbook("tiny")
            screen = await until(
                pilot,
                lambda: (
                    app.screen
                    if isinstance(app.screen, PlaybookScreen) and app.screen.checks
                    else None
                ),
                what="the playbook",
            )
            step = screen.checks[2]
            assert (step.state, step.action, step.target) == ("next", "fail_over", "tiny-vllm")
            assert screen.checks[1].detail == "tiny-vllm is ready on cpu-1"
            await until(pilot, lambda: app.gateway_role == "admin", what="the gateway's role")
            await pilot.press("enter")
            plan = await until(
                pilot,
                lambda: app.screen if isinstance(app.screen, FailoverScreen) else None,
                what="the failover plan",
            )
            assert plan.target == "tiny-vllm"  # vLLM, the standby: not Triton
            # The plan drains Triton onto it, as the step says, and keeps saying so once its
            # fields are mounted (their first Changed events reset them to the defaults).
            fields = await until(
                pilot,
                lambda: plan.is_mounted
                and plan.query("#onto")
                and (plan.query_one("#move", Select).value, plan.query_one("#target", Select).value,
                     plan.query_one("#onto", Select).value),
                what="the plan's fields",
            )  # fmt: skip
            await pilot.pause()
            assert fields == ("drain", "tiny-trt", "tiny-vllm")
            assert (
                plan.query_one("#move", Select).value,
                plan.query_one("#target", Select).value,
                plan.query_one("#onto", Select).value,
            ) == ("drain", "tiny-trt", "tiny-vllm")
            # What is left is to read the move, whole, and type the model's name: the keys
            # land in the confirmation (they went to the first Select, and were lost).
            what = str(plan.query_one("#confirm-what", SafeStatic).render())
            assert "drain tiny-trt onto tiny-vllm: type tiny below to confirm" in what, what
            await pilot.press(*"tiny")
            assert plan.query_one("#confirm", Input).value == "tiny"
            assert not plan.query_one("#go", Button).disabled
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is screen, what="back on the playbook")

            moved = gateway.admin(
                "PUT", "/admin/routes/tiny",
                json={"weights": {"tiny-trt": 0, "tiny-vllm": 100}, "why": "by hand"},
            )  # fmt: skip
            assert moved.status_code == 200, moved.text
            done = await until(
                pilot,
                lambda: screen.checks[2] if screen.checks[2].state == "done" else None,
                what="step 3 done from the gateway's live weights",
            )
            assert done.detail == "tiny-vllm carries the traffic; tiny-trt has weight 0"
            assert (screen.checks[3].state, screen.checks[3].action) == ("next", "run_drill")
