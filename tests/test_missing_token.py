"""A missing secret costs one node, not the fleet (issue 15).

An on-call engineer who holds tokens for some nodes only, or who runs the example
fleet.toml as shipped, still gets the console, `check` and `drill list` for everything
else; the node without a token shows as `no token (NAME is not set)`, counted apart from
up, stale and down. A file that is actually malformed still exits 3.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

from textual.widgets import Static

from console.core.config.load import load_fleet, parse_fleet
from console.tui.app import EngineroomApp
from console.tui.screens.node import NodeScreen
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.table import FleetTable, Row
from tests.conftest import ROOT, VIEWER, agent_env, run_cli
from tests.engines.servers import stop, wait_until
from tests.support.fleet import deployment, fleet_toml
from tests.test_tui_numbers import open_view
from tests.tui_support import keys, until

AGENT_FLEET = """
[fleet]
name = "tokens"
refresh_s = 0.5
[agent]
scrape_interval_s = 0.5
discover = false
[[nodes]]
name = "held"
agent = "http://127.0.0.1:9410"
"""


def console_fleet(agent_url: str) -> str:
    """Two nodes: one whose token this console holds, one whose variable is not set. (It
    starts with a blank line, as the file the malformed-file test names line 9 of did.)"""
    return "\n" + fleet_toml(
        fleet={"name": "tokens", "refresh_s": 0.5},
        nodes=[{"name": "held", "agent": agent_url, "token_env": "T_HELD"},
               {"name": "other-team", "agent": "http://127.0.0.1:9", "token_env": "T_NOT_MINE"}],
        models=[{"name": "tiny", "deployments": [
            deployment("tiny-other", "other-team", "triton", 8001, engine_dir="/engines/tiny"),
            deployment("tiny-baseline", "other-team", "vllm", 8002),
        ]}],
        drills={"rebuild-other": {"model": "tiny", "deployment": "tiny-other",
                                  "checkpoint": "/models/tiny"}},
    )  # fmt: skip


def without_tokens(**extra: str) -> dict[str, str]:
    env = agent_env(**extra)
    for name in ("T_NOT_MINE", "ENGINEROOM_TOKEN", "ENGINEROOM_DEMO_TOKEN"):
        env.pop(name, None)
    return env


async def test_the_console_watches_every_node_it_holds_a_token_for(agent_factory, monkeypatch):
    agent = agent_factory(AGENT_FLEET, node="held")
    monkeypatch.setenv("T_HELD", VIEWER)
    monkeypatch.delenv("T_NOT_MINE", raising=False)
    app = EngineroomApp(parse_fleet(console_fleet(agent.url)))  # it exited 3 here
    async with app.run_test(size=(120, 30)) as pilot:

        def held_up() -> FleetTable | None:
            tables = app.screen.query("#nodes")
            row = tables.first(FleetTable).rows_by_key.get("held") if tables else None
            return tables.first(FleetTable) if row and row.fields["status"] == "up" else None

        table = await until(pilot, held_up, timeout=30, what="the held node up")
        held, other = table.get_row("held"), table.get_row("other-team")
        assert str(held[1]) == "up"
        assert str(other[1]) == "no token"
        assert str(other[-1]) == "no token (T_NOT_MINE is not set)"
        header = str(app.screen.query_one(FleetHeader).render())
        assert "1 up" in header and "1 no token" in header and "down" not in header
        assert app.action_blocked("other-team") == "no token for other-team (T_NOT_MINE is not set)"

        await pilot.press(*keys(":node other-team"), "enter")

        def info() -> str:
            screen = app.screen
            shown = isinstance(screen, NodeScreen) and screen.query("#node-info")
            return str(screen.query_one("#node-info", Static).content) if shown else ""

        text = await until(pilot, info, what="the node's info line")
        assert text.startswith("other-team no token (T_NOT_MINE is not set)"), text

        await pilot.press("escape")
        models = await open_view(app, pilot, "models", "d:tiny:tiny-other")
        row = models.rows_by_key["d:tiny:tiny-other"]
        assert row.fields["state"] == "unknown"
        assert "no token (T_NOT_MINE is not set)" in str(
            next(d for d in app.view.models["tiny"] if d.id == "tiny-other").reason
        )


def test_check_reports_the_node_without_a_token_apart_and_polls_the_rest(agent_factory, tmp_path):
    agent = agent_factory(AGENT_FLEET, node="held")
    fleet = tmp_path / "console.toml"
    fleet.write_text(console_fleet(agent.url))
    env = without_tokens(T_HELD=VIEWER)

    def both_seen() -> dict | None:
        result = run_cli("check", "--fleet", str(fleet), "--json", env=env)
        assert result.returncode != 3, result.stderr  # it was 3: nothing polled
        report = json.loads(result.stdout)
        return report if report["summary"]["nodes_up"] == 1 else None

    report = wait_until(both_seen, 30, interval=0.5, what="the held node up")
    nodes = {n["name"]: n for n in report["nodes"]}
    assert nodes["held"]["status"] == "up"
    assert nodes["other-team"]["status"] == "no token"
    assert nodes["other-team"]["error"] == "T_NOT_MINE is not set"
    assert report["summary"]["nodes_no_token"] == 1 and report["summary"]["nodes_down"] == 0
    assert report["status"] == "degraded"  # a node nobody here can see is not known healthy

    table = run_cli("check", "--fleet", str(fleet), env=env)
    assert table.returncode == 1, table.stderr
    assert "1 no token" in table.stdout
    assert "no token (T_NOT_MINE is not set)" in table.stdout
    # Issue 28 #4: blind to a node, the summary says so first and never "alerts 0".
    assert report["summary"]["nodes_unseen"] == 1
    first = table.stdout.splitlines()[0]
    assert "CANNOT SEE 1 OF 2 NODES" in first and "alerts ? (1 nodes unseen)" in first


def test_drill_list_shows_the_definitions_with_no_token_at_all(tmp_path):
    fleet = tmp_path / "console.toml"
    fleet.write_text(console_fleet("http://127.0.0.1:9"))
    env = without_tokens()
    env.pop("T_HELD", None)
    listed = run_cli("drill", "list", "--fleet", str(fleet), env=env)
    assert listed.returncode == 0, listed.stderr  # it was 3
    line = next(x for x in listed.stdout.splitlines() if x.startswith("rebuild-other"))
    assert "tiny-other" in line and "? no token (T_NOT_MINE is not set)" in line
    assert "other-team: history not read: no token (T_NOT_MINE is not set)" in listed.stderr
    as_json = json.loads(run_cli("drill", "list", "--fleet", str(fleet), "--json", env=env).stdout)
    assert [d["name"] for d in as_json["drills"]] == ["rebuild-other"]
    assert as_json["no_token"] == {
        "held": "no token (T_HELD is not set)",
        "other-team": "no token (T_NOT_MINE is not set)",
    }


async def test_the_example_fleet_file_as_shipped_runs_without_its_token(monkeypatch):
    example = ROOT / "fleet.toml"
    env = without_tokens()
    checked = run_cli("check", "--fleet", str(example), env=env)
    assert checked.returncode == 2, checked.stderr  # no node answered; it was 3
    assert "no token (ENGINEROOM_TOKEN is not set)" in checked.stdout
    listed = run_cli("drill", "list", "--fleet", str(example), env=env)
    assert listed.returncode == 0, listed.stderr

    monkeypatch.delenv("ENGINEROOM_TOKEN", raising=False)
    app = EngineroomApp(load_fleet(example))
    async with app.run_test(size=(100, 24)) as pilot:

        def local() -> Row | None:
            tables = app.screen.query("#nodes")
            return tables.first(FleetTable).rows_by_key.get("local") if tables else None

        row = await until(pilot, local, what="the example's node")
        assert row.fields["status"] == "no token"
        assert str(row.made()[-1]) == "no token (ENGINEROOM_TOKEN is not set)"


def test_a_malformed_file_still_exits_3_naming_the_line(tmp_path):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(console_fleet("http://127.0.0.1:9").replace("token_env", "tokn_env", 1))
    for argv in (["check"], ["drill", "list"]):
        result = run_cli(*argv, "--fleet", str(fleet), env=without_tokens())
        assert result.returncode == 3
        assert "fleet.toml:9: nodes[0].tokn_env: unknown key 'tokn_env'" in result.stderr


def test_demo_no_tui_says_where_a_second_console_gets_its_token(tmp_path):
    env = without_tokens()
    err = tmp_path / "demo.err"
    with err.open("wb") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-m", "console.cli", "demo", "--no-tui", "--nodes", "1"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        assert demo.stdout is not None
        ready, _, _ = select.select([demo.stdout], [], [], 60)
        assert ready, f"no fleet line within 60 s: {err.read_text()}"
        first = demo.stdout.readline().decode()
        assert first.startswith("fleet: "), first
        fleet = Path(first.removeprefix("fleet: ").strip())
        export = next(
            (x for x in err.read_text().splitlines() if "export ENGINEROOM_DEMO_TOKEN=" in x), ""
        )
        token = export.split("=", 1)[1] if export else ""
        assert token, err.read_text()  # the token was generated and never shown
        # A second console with what the first printed: it sees the fleet.
        second = {**env, "ENGINEROOM_DEMO_TOKEN": token}

        def seen() -> bool:
            checked = run_cli("check", "--fleet", str(fleet), "--json", env=second)
            return json.loads(checked.stdout)["summary"]["nodes_up"] == 1

        wait_until(seen, 30, interval=0.5, what="the demo node up for a second console")
    finally:
        stop(demo, grace=15)
