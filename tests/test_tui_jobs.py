"""Starting vLLM from the console against a real agent: the form shows the agent's plan,
the confirmation names the target, the job is followed live, and read-only consoles and
viewer tokens cannot act.

The profile's command is this test's own python, which has no vLLM: the engine the agent
starts exits at once, so the job fails with the engine's real error in its log tail. That
is the "crash during load" path, through the console, in seconds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest
from textual.widgets import Select

from console.core.config.load import parse_fleet
from console.tui.app import EngineroomApp
from console.tui.screens.jobs import JobScreen, JobsScreen, StartVllmScreen
from console.tui.screens.node import NodeScreen
from console.tui.widgets.confirm import ConfirmScreen
from tests.conftest import OPERATOR, VIEWER, agent_env, run_cli
from tests.engines.servers import free_port
from tests.support.fleet import (
    SMALL_VLLM_ARGS,
    deployment,
    fleet_model,
    fleet_toml,
    model_dir,
    one_node_fleet,
    vllm_profile,
)
from tests.tui_support import on_top, until

SIZE = (120, 40)


@pytest.fixture
def setup(agent_factory, tmp_path: Path):
    model = model_dir(tmp_path)
    agent_port, port = free_port(), free_port()

    def make(token_env: str) -> str:
        node = {"name": "local", "agent": f"http://127.0.0.1:{agent_port}", "token_env": token_env}
        return fleet_toml(
            fleet={"name": "jobs"},
            agent={"state_dir": tmp_path / "state", "scrape_interval_s": 0.5},
            nodes=[node],
            profiles={
                "tiny": vllm_profile("local", model, port, sys.executable, overridable=["port"])
            },
        )

    agent_factory(make("UNUSED"), port=agent_port)
    os.environ["T_OPERATOR"] = OPERATOR.split(":", 1)[1]
    os.environ["T_VIEWER"] = VIEWER
    return make


async def test_start_vllm_from_the_node_screen_shows_the_plan_and_follows_the_job(setup):
    app = EngineroomApp(parse_fleet(setup("T_OPERATOR")))
    async with app.run_test(size=SIZE) as pilot:
        app.open_node("local")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen), what="node screen")
        await until(pilot, lambda: app.roles.get("local") == "operator", what="role learned")
        await pilot.press("s")
        form = await on_top(pilot, app, StartVllmScreen)
        plan = await until(pilot, lambda: form.plan, what="the agent's plan")
        assert plan.ok and plan.argv[0] == sys.executable
        shown = str(form.query_one("#plan").render())
        assert "vllm.entrypoints.openai.api_server" in shown and "ok   port" in shown

        await pilot.press("ctrl+s")
        confirm = await on_top(pilot, app, ConfirmScreen)
        assert confirm.title_text == "Start tiny on local?"
        assert plan.engine_id in confirm.body
        await pilot.press("y")

        job_screen = await on_top(pilot, app, JobScreen)
        job = await until(
            pilot,
            lambda: job_screen.job if job_screen.job and job_screen.job.state == "failed" else None,
            what="the job to fail",
        )
        assert job.error.startswith("load: the engine exited with code 1")
        assert any("No module named 'vllm'" in line for line in job.result["log_tail"])
        info = await until(
            pilot,
            lambda: next(
                (t for w in job_screen.query("#job-info") if "FAILED" in (t := str(w.render()))),
                None,
            ),
            what="the job screen to say FAILED",
        )
        assert "by alice" in info

        await pilot.press("escape")
        await pilot.press("j")
        await until(pilot, lambda: isinstance(app.screen, JobsScreen), what="jobs screen")
        await until(
            pilot,
            lambda: (
                app.collector.states["local"].snapshot
                and app.collector.states["local"].snapshot.jobs
            ),
            what="the job in the snapshot",
        )


async def test_read_only_and_viewer_tokens_disable_actions_visibly(setup):
    for app, reason in (
        (
            EngineroomApp(parse_fleet(setup("T_OPERATOR")), read_only=True),
            "read-only console",
        ),
        (EngineroomApp(parse_fleet(setup("T_VIEWER"))), "viewer token"),
    ):
        async with app.run_test(size=SIZE) as pilot:
            app.open_node("local")
            await until(pilot, lambda a=app: isinstance(a.screen, NodeScreen), what="node screen")
            if not app.read_only:
                await until(pilot, lambda a=app: a.roles.get("local") == "viewer", what="role")
            await until(
                pilot,
                lambda a=app, r=reason: any(
                    r in str(w.render()) for w in a.screen.query("#node-info")
                ),
                what=f"the node screen to say {reason!r}",
            )
            await pilot.press("s")
            # Nothing to wait for: an enabled key would push the form in its own handler
            # (console/tui/workflows.py start_vllm), so it would be on top once the key's
            # messages are handled.
            await pilot.pause()
            assert isinstance(app.screen, NodeScreen), "the form opened anyway"
            assert app.screen.check_action("start_vllm", ()) is None  # shown, dimmed


async def test_a_stop_the_agent_refuses_is_said_in_its_words_and_opens_no_job(setup):
    """The workflows' one agent call (console/tui/workflows.py): confirm, call, and a
    refusal is a notification naming the node and the engine, not a job screen."""
    app = EngineroomApp(parse_fleet(setup("T_OPERATOR")))
    async with app.run_test(size=SIZE) as pilot:
        app.open_node("local")
        await until(pilot, lambda: isinstance(app.screen, NodeScreen), what="node screen")
        await until(pilot, lambda: app.roles.get("local") == "operator", what="role learned")
        app.stop_engine("local", "no-such-engine")
        confirm = await on_top(pilot, app, ConfirmScreen)
        assert confirm.title_text == "Stop no-such-engine on local?"
        await pilot.press("y")
        refused = await until(
            pilot,
            lambda: next((n for n in app._notifications if n.title == "refused"), None),
            what="the refusal",
        )
        assert refused.message == "local: engine: no engine 'no-such-engine' on local"
        assert refused.severity == "error"
        assert isinstance(app.screen, NodeScreen), "a job screen opened for a refused stop"


def standby_fleet(state: Path, agent_port: int, port: int, model: Path, python: str) -> str:
    """Model "tiny" on a Triton and a vLLM standby (weight 0) its profile starts, behind a
    gateway that is not running: the plan says so; the flow is the console's."""
    profile = vllm_profile(
        "local", model, port, python, args={**SMALL_VLLM_ARGS, "optimization_level": 0},
        env={"VLLM_CPU_KVCACHE_SPACE": "1"}, stop_grace_s=10,
    )  # fmt: skip
    profile["command"] = ["taskset", "-c", "0", "nice", "-n", "19", *profile["command"]]
    standby = deployment("tiny-standby", "local", "vllm", port, weight=0, profile="tiny")
    return one_node_fleet(
        "standby",
        fleet_model("tiny", deployment("tiny-trt", "local", "triton", 9), standby),
        agent_url=f"http://127.0.0.1:{agent_port}",
        token_env="T_OPERATOR",
        agent={"state_dir": state, "scrape_interval_s": 20},  # 20: the race made plain
        gateway={"url": "http://127.0.0.1:9"},
        profiles={"tiny": profile},
    )


@pytest.mark.engines
async def test_a_standby_started_from_the_failover_plan_reopens_it_with_the_standby(
    agent_factory, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    """Issue 5: "Start a vLLM standby first" runs the lifecycle job (real vLLM), then the
    failover plan opens again with the new standby as its target. At once, `engineroom
    check` reads the standby ready: a start that says ready is ready in the agent's
    snapshot, though its next scrape is up to 20 s away (before, the snapshot, and check,
    said "loading" until then)."""
    from console.tui.screens.failover import FailoverScreen
    from tests.engines import servers

    agent_port, port = free_port(), free_port()
    text = standby_fleet(
        tmp_path / "state", agent_port, port, tiny_model_dir, servers.vllm_python()
    )
    agent = agent_factory(text, port=agent_port)
    monkeypatch.setenv("T_OPERATOR", OPERATOR.split(":", 1)[1])
    monkeypatch.setenv("ENGINEROOM_ADMIN_TOKEN", "admin-token-of-no-gateway")
    app = EngineroomApp(parse_fleet(text))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.roles.get("local") == "operator", what="role learned")
            app.fail_over("tiny")
            plan = await on_top(pilot, app, FailoverScreen)
            await until(
                pilot,
                lambda: any(s.value != Select.NULL for s in plan.query("#target")),
                what="the plan mounted, its target selected",
            )
            plan.query_one("#standby").press()
            form = await on_top(pilot, app, StartVllmScreen)
            await until(pilot, lambda: form.plan, what="the agent's plan")
            await pilot.press("ctrl+s")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            await pilot.press("y")
            again = await on_top(
                pilot,
                app,
                FailoverScreen,
                timeout=float(os.environ.get("T_WAIT", "150")),
                what="the failover plan, back after the standby is ready",
            )
            assert again.target == "tiny-standby"
            # The screen is pushed before it is mounted, and its Select takes its value on
            # mount: wait for the value (on a busy machine it was still Select.NULL here).
            target = await until(
                pilot,
                lambda: next((s for s in again.query("#target") if s.value != Select.NULL), None),
                what="the plan's target selected",
            )
            assert target.value == "tiny-standby"
        engine_id = f"vllm-{port}"
        assert agent.engine(engine_id)["state"] == "ready"
        (job,) = [j for j in agent.get("/v1/jobs").json() if j["kind"] == "vllm.start"]
        assert job["state"] == "succeeded" and job["result"]["snapshot_state"] == "ready", job
        fleet = tmp_path / "console.toml"
        fleet.write_text(text)
        checked = run_cli("check", "--fleet", str(fleet), "--json",
                          env=agent_env(T_OPERATOR=OPERATOR.split(":", 1)[1]))  # fmt: skip
        report = json.loads(checked.stdout)
        (node,) = report["nodes"]
        assert next(e for e in node["engines"] if e["id"] == engine_id)["state"] == "ready"
        rows = [d for m in report["models"] for d in m["deployments"]
                if d["engine_id"] == engine_id]  # fmt: skip
        assert rows and all(d["state"] == "ready" for d in rows), rows
    finally:  # stop the standby: its job, followed to the end
        headers = {"Authorization": f"Bearer {OPERATOR.split(':', 1)[1]}"}
        for engine in agent.snapshot()["engines"]:
            if engine.get("profile") == "tiny":
                stop = httpx.post(
                    agent.url + "/v1/jobs",
                    json={"kind": "engine.stop", "engine": engine["id"]},
                    headers=headers,
                    timeout=10,
                ).json()
                servers.wait_until(
                    lambda s=stop: (
                        agent.get(f"/v1/jobs/{s['id']}").json()["state"] in ("succeeded", "failed")
                    ),
                    timeout=60,
                    what="the standby stopped",
                )


async def test_a_port_override_that_detaches_the_engine_from_its_deployment_says_so(setup):
    """Issue 28, dialogs that flow: a port override moves the engine away from the
    endpoint its deployment names, so the gateway would route nothing to it."""
    from textual.widgets import Input

    text = setup("T_OPERATOR")
    port = text.split("port = ", 1)[1].split("\n", 1)[0]
    standby = deployment("tiny-standby", "local", "vllm", port, profile="tiny", weight=0)
    text += fleet_toml(models=[fleet_model("tiny", standby)])
    app = EngineroomApp(parse_fleet(text))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.roles.get("local") == "operator", what="role learned")
        app.start_vllm(model="tiny")
        form = await on_top(pilot, app, StartVllmScreen)
        await until(pilot, lambda: form.plan, what="the agent's plan")
        assert "detached" not in str(form.query_one("#plan").render())  # its own port
        other = str(free_port())
        form.query_one("#o-port", Input).value = other
        shown = await until(
            pilot,
            lambda: (p := str(form.query_one("#plan").render())) and "detached" in p and p,
            what="the plan to say the engine is detached",
        )
        assert "tiny-standby (tiny) expects" in shown and f":{other}" in shown


async def test_cancelling_the_standby_form_returns_to_the_failover_plan(setup, monkeypatch):
    """Issue 28, dialogs that flow: "start a standby first", then Esc on the form, left the
    operator on the screen under the plan, the plan gone."""
    from console.tui.screens.failover import FailoverScreen

    text = setup("T_OPERATOR").replace(
        "[agent]", f'[gateway]\nurl = "http://127.0.0.1:{free_port()}"\ntoken_env = "T_GW"\n[agent]'
    )
    standby = deployment("tiny-standby", "local", "vllm", 8, profile="tiny", weight=0)
    text += fleet_toml(
        models=[fleet_model("tiny", deployment("tiny-a", "local", "vllm", 9, weight=100), standby)]
    )
    monkeypatch.setenv("T_GW", "admin-token-of-no-gateway")
    app = EngineroomApp(parse_fleet(text))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.roles.get("local") == "operator", what="role learned")
        app.fail_over("tiny")
        plan = await on_top(pilot, app, FailoverScreen)
        await until(pilot, lambda: plan.is_mounted and plan.query("#standby"), what="mounted")
        plan.query_one("#standby").press()
        await until(pilot, lambda: isinstance(app.screen, StartVllmScreen), what="the form")
        await pilot.press("escape")
        back = await on_top(
            pilot, app, FailoverScreen, what="the failover plan, back after the form was cancelled"
        )
        assert back.model == "tiny"
