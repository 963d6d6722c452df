"""The console as an on-call engineer drives it: keys, commands, filters, read-only."""

from __future__ import annotations

import os

from console.collect.sources.collector import Collector
from console.core.config.load import parse_fleet
from console.tui.app import EngineroomApp
from console.tui.screens.events import EventsScreen
from console.tui.screens.fleet import FleetScreen
from console.tui.screens.gpus import GpusScreen
from console.tui.screens.help import HelpScreen
from console.tui.screens.model_detail import ModelDetailScreen
from console.tui.screens.models import ModelsScreen
from console.tui.screens.node import NodeScreen
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.table import FleetTable
from tests.support.fleet import fleet_toml
from tests.support.hung import hung_host, switch_screens
from tests.tui_support import FLEET, keys, recorded_app, until

SIZE = (100, 30)


async def command(pilot, text: str) -> None:
    await pilot.press(*keys(":" + text), "enter")
    await pilot.pause()


def header_text(app: EngineroomApp) -> str:
    return str(app.screen.query_one(FleetHeader).render())


async def test_colon_commands_open_every_view_and_escape_goes_back():
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        for text, screen in (
            ("models", ModelsScreen),
            ("gpus", GpusScreen),
            ("events", EventsScreen),
            ("node h200", NodeScreen),
            ("model tiny", ModelDetailScreen),
        ):
            await command(pilot, text)
            assert isinstance(app.screen, screen), text
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, FleetScreen), f"escape after :{text}"


async def test_enter_on_a_node_opens_it_with_its_gpus_and_processes():
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("enter")  # the cursor starts on the first node, h200
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.node == "h200"
        gpus = app.screen.query_one("#node-gpus", FleetTable)
        assert gpus.row_count == 2
        info = str(app.screen.query_one("#node-info").render())
        assert "driver 580.159.04" in info and "CUDA 13.0" in info


async def test_the_fleet_view_says_which_node_is_down_and_why():
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        # The first view drawn: the table has the node's row and the header its count.
        await until(
            pilot,
            lambda: (
                app.screen.query(FleetHeader)
                and "down" in header_text(app)
                and "gone" in app.screen.query_one(FleetTable).rows_by_key
            ),
            what="the fleet view with the down node",
        )
        nodes = app.screen.query_one(FleetTable)
        row = nodes.rows_by_key["gone"]
        assert row.fields["status"] == "down"
        assert "connection refused" in str(row.made()[-1])
        assert "1 down" in header_text(app)
        assert "alerts" in header_text(app)


async def test_slash_filters_by_predicate_and_escape_clears_it():
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await command(pilot, "gpus")
        table = app.screen.query_one(FleetTable)
        assert table.row_count == 2  # the two H200s; the CPU node has none
        await pilot.press(*keys("/util>50"), "enter")
        await pilot.pause()
        assert table.row_count == 1
        assert table.selected().fields["util"] == 99.0
        assert "/util>50" in header_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert table.row_count == 2
        assert isinstance(app.screen, GpusScreen)  # the first escape only cleared the filter


async def test_filters_on_the_models_view_use_engine_and_latency_fields():
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await command(pilot, "models")
        table = app.screen.query_one(FleetTable)
        assert {k for k in table.rows_by_key if k.startswith("d:")} == {
            "d:tiny:tiny-trt",
            "d:tiny:tiny-vllm",
        }
        await pilot.press(*keys("/engine=triton"), "enter")
        await pilot.pause()
        assert {k for k in table.rows_by_key if k.startswith("d:")} == {"d:tiny:tiny-trt"}


async def test_a_bad_filter_or_command_is_explained_not_fatal():
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*keys("/util>hot"), "enter")
        await pilot.pause()
        await command(pilot, "frobnicate")
        messages = [n.message for n in app._notifications]
        assert any("util>hot: > needs a number" in m for m in messages)
        assert any("unknown command 'frobnicate'" in m for m in messages)
        assert isinstance(app.screen, FleetScreen)


async def test_question_mark_shows_the_keys_and_the_palette_lists_views():
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"View models", "View gpus", "Node h200", "Model tiny"} <= set(titles)


async def test_keys_are_remappable_in_the_fleet_file():
    app = recorded_app(
        FLEET.replace("refresh_s = 0.2\n", 'refresh_s = 0.2\n[keys]\nmodels = "M"\n', 1)
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("m")  # no longer bound
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("M")
        await pilot.pause()
        assert isinstance(app.screen, ModelsScreen)


async def test_prod_is_red_and_read_only_by_default():
    app = recorded_app(FLEET.replace('environment = "staging"', 'environment = "prod"'))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.read_only
        header = app.screen.query_one(FleetHeader)
        assert header.has_class("prod")
        assert "READ-ONLY" in header_text(app) and "PROD" in header_text(app)


async def test_the_ui_answers_keys_while_a_node_hangs(tmp_path):
    # A real agent URL that accepts connections and never answers.
    async with hung_host() as host:
        os.environ["T_HUNG"] = "token-0123456789"
        agent = f"http://127.0.0.1:{host.port}"
        node = {"name": "hung", "agent": agent, "token_env": "T_HUNG"}
        fleet = parse_fleet(fleet_toml(fleet={"name": "hung", "refresh_s": 2.0}, nodes=[node]))
        # The poll's timeout is long enough that a UI answering keys is never in a race with it.
        app = EngineroomApp(fleet, collector=Collector(fleet, on_update=None, timeout_s=12))
        async with app.run_test(size=SIZE) as pilot:
            # The first poll has reached the hung node and now waits on it, for up to 12 s.
            await until(pilot, lambda: host.accepted, timeout=10, what="the poll's connection")
            await switch_screens(pilot, app)
            # Every key was answered while that poll still waited: a UI that waited on the
            # poll would have switched screens only after its 12 s timeout (state, not a clock).
            assert app.collector.states["hung"].error is None, "the keys waited for the poll"
            error = await until(
                pilot,
                lambda: app.collector.states["hung"].error,
                timeout=30,
                what="the poll's timeout",
            )
            assert error == "no answer within 12 s"


async def test_a_filter_that_empties_the_table_says_why():
    """Issue 28 #12: `foo=bar`, `temp>`, `util > 80` and `ttft_p95>0.5` on GPUs each gave
    an empty table with no word, and `:engine gpu-a1/zzz` an empty screen."""
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await command(pilot, "gpus")
        table = app.screen.query_one(FleetTable)

        def said() -> list[str]:
            return [str(n.message) for n in app._notifications]

        for typed, word in (
            ("foo=bar", "no field 'foo' here; fields: "),
            ("ttft_p95>0.5", "no field 'ttft_p95' here"),
            ("temp>", "temp>: write FIELD OP VALUE"),
        ):
            await pilot.press(*keys("/" + typed), "enter")
            await until(pilot, lambda w=word: any(w in m for m in said()), what=word)
            assert table.row_count == 2, f"{typed} emptied the table"
        assert any("util" in m and "temp" in m for m in said() if "fields:" in m)

        # Spaces around the operator read as the predicate, not three words of text.
        await pilot.press(*keys("/util > 50"), "enter")
        await until(pilot, lambda: table.row_count == 1, what="util > 50 applied")
        assert "1 of 2 rows match" in header_text(app)
        await pilot.press(*keys("/util>100"), "enter")
        await until(pilot, lambda: table.row_count == 0, what="util>100 applied")
        assert "0 of 2 rows match" in header_text(app)

        await command(pilot, "engine cpu-1/zzz")
        assert any("no engine 'zzz' on cpu-1; its engines: " in m for m in said())
        assert isinstance(app.screen, GpusScreen)


async def test_a_console_blind_to_a_node_says_so_first_and_never_no_alerts():
    """Issue 28 #4: a console that could not read its nodes (no token for them) showed a
    green "no alerts"."""
    os.environ.pop("T_BLIND_UNSET", None)
    fleet = parse_fleet(
        '[fleet]\nname = "blind"\nrefresh_s = 0.2\n[[nodes]]\nname = "n1"\n'
        'agent = "http://127.0.0.1:1"\ntoken_env = "T_BLIND_UNSET"\n'
    )
    app = EngineroomApp(fleet)
    async with app.run_test(size=(120, 30)) as pilot:
        line = await until(pilot, lambda: "no token" in (h := header_text(app)) and h)
        assert line.index("cannot see 1 of 1 nodes") < line.index("nodes 0 up")
        assert "no alerts" not in line and "alerts ? (1 unseen)" in line
