"""Every value fits its column on every screen, at 80x24 and at 200x50 (issue 28, #9).

The GPUs screen showed `software thermal slvllm-18001` (a clock-reasons cell run into the
next column) and the Node screen's RUNS column `trit` (a cell cut by the terminal's edge,
with nothing to say it was cut). These render each screen over the demo fleet (real
agents and a real gateway over SIMULATED GPUs and engines) and read every table cell:
a cell in a column of fixed width is narrower than it (the tables have no cell padding,
so one as wide touches the next value), no column is cut by the terminal's edge, and a
cell of the last, free-width column ends on screen (an ellipsis says what was cut).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import Static

from console.core.config.load import load_fleet
from console.tui.app import EngineroomApp
from console.tui.columns import Fitted, layout
from console.tui.screens.models import COLUMNS, ModelsScreen
from console.tui.widgets.table import FleetTable
from tests.sim.conftest import TOKEN, SimFleet, end, start_sim
from tests.tui_support import keys, recorded_app, until

SIZES = ((80, 24), (200, 50))
# Each screen by the `:` command that opens it, and the table that must have rows.
SCREENS = {
    "nodes": "#nodes",
    "gpus": "#gpus",
    "models": "#models",
    "node gpu-a1": "#node-gpus",
    "events": "#events",
    "jobs": None,
    "drills": None,
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    sim = start_sim(tmp_path_factory.mktemp("demo"), "--nodes", "2")
    yield sim
    end(sim)


def _text(cell: object) -> str:
    return (cell if isinstance(cell, Text) else Text(str(cell))).plain.rstrip()


def overruns(table: FleetTable) -> list[str]:
    """What runs into the next column or off the terminal, in this table as drawn: the
    first such cell of each column."""
    shown = table.scrollable_content_region.width  # inside its scrollbar
    bad: list[str] = []
    x = 0
    for c, column in enumerate(table.ordered_columns):
        label = column.label.plain.replace("\n", " ")
        width = column.get_render_width(table)
        cells = [_text(table.get_cell_at(Coordinate(r, c))) for r in range(table.row_count)]
        for text in filter(None, cells):
            w = Text(text).cell_len
            if not column.auto_width and w >= width:
                bad.append(f"{label}: {text!r} is {w} wide, its column {width}")
                break
            if x + w > shown:
                bad.append(f"{label}: {text!r} ends at {x + w}, past the terminal's {shown}")
                break
        else:
            if not column.auto_width and x + width > shown and any(cells):
                bad.append(f"{label}: the column ends at {x + width}, past the terminal's {shown}")
        x += width
    return bad


def measured(table: FleetTable) -> bool:
    """The table is laid out and has measured what it holds (Textual does that when the
    table is idle): each auto-width column is as wide as its widest cell, and the
    scrollable height counts every row."""
    header = table.header_height if table.show_header else 0
    if not table.size.width or table.virtual_size.height < table.row_count + header:
        return False
    for c, column in enumerate(table.ordered_columns):
        if not column.auto_width:
            continue
        cells = (table.get_cell_at(Coordinate(r, c)) for r in range(table.row_count))
        if column.content_width < max((Text(_text(x)).cell_len for x in cells), default=0):
            return False
    return True


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_no_cell_runs_into_the_next_on_any_screen(demo, monkeypatch, size):
    monkeypatch.setenv("ENGINEROOM_DEMO_TOKEN", TOKEN)
    app = EngineroomApp(load_fleet(demo.fleet))
    async with app.run_test(size=size) as pilot:
        # The gateway's figures and every node's first snapshot are in.
        await until(
            pilot,
            lambda: app.gateway_snapshot and app.view and app.view.summary.nodes_up == 2,
            timeout=60,
            what="the demo fleet read",
        )
        found: dict[str, list[str]] = {}
        for command, main in SCREENS.items():
            await pilot.press(*keys(":" + command), "enter")

            def drawn(main: str | None = main) -> bool:
                screen = app.screen
                if not screen.is_mounted or not screen.query(FleetTable):
                    return False
                if main is not None and not any(t.row_count for t in screen.query(main)):
                    return False
                return all(measured(t) for t in screen.query(FleetTable))

            await until(pilot, drawn, what=f":{command} drawn and measured")
            await pilot.pause()
            for table in app.screen.query(FleetTable):
                if bad := overruns(table):
                    found[f"{command} {table.id}"] = bad
            await pilot.press("escape")
        assert found == {}, "\n".join(f"{k}: {v}" for k, vs in found.items() for v in vs)


@pytest.mark.parametrize("width", (80, 100, 200))
async def test_models_says_which_columns_it_dropped(width):
    """At 100 columns Models cut its table at the terminal's edge and said nothing of the
    columns past it; now it drops whole columns and names them under the table."""
    app = recorded_app()
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.press(*keys(":models"), "enter")
        table = await until(
            pilot,
            lambda: (
                isinstance(app.screen, ModelsScreen)
                and app.screen.query("#models")
                and app.screen.query_one("#models", FleetTable).row_count
                and app.screen.query_one("#models", FleetTable)
            ),
            what="Models drawn",
        )
        assert overruns(table) == []
        shown = [c.label.plain for c in table.ordered_columns]
        shown[0] = shown[0].strip()
        hidden = [label.replace("\n", " ") for label, _ in COLUMNS if label not in shown]
        note = app.screen.query_one("#models-hidden", Static)
        if width == 200:
            assert hidden == [] and not note.display
            return
        text = str(note.render()).rstrip()
        assert hidden and note.display
        assert len(text) < width  # one line: what does not fit it ends in an ellipsis
        prefix = "hidden at this width, widen to see: "
        assert text.startswith(prefix + ", ".join(hidden)[: len(text) - len(prefix) - 1])
        assert "ENGINE" in hidden and "NODE" in hidden


async def test_a_terminal_made_narrower_lays_every_table_out_again():
    """The screenshots' Fleet at 80x24 scrolled sideways: its ENGINES column kept the
    width it had at 140 columns. Every table is made anew for the new width."""
    app = recorded_app()
    async with app.run_test(size=(140, 30)) as pilot:
        for command in ("nodes", "gpus", "models", "node h200"):
            await pilot.resize_terminal(140, 30)
            await pilot.press(*keys(":" + command), "enter")

            def fitted(width: int) -> list[FleetTable] | None:
                """The screen's tables laid out for `width` (those made anew are in), drawn
                and measured."""
                screen, tables = app.screen, list(app.screen.query(FleetTable))
                fits = [f for f in vars(screen).values() if isinstance(f, Fitted)]
                ok = (
                    tables
                    and all(not f.busy and f.fit == layout(f.spec, width, f.spare) for f in fits)
                    and all(t.size.width == width and t.row_count and measured(t) for t in tables)
                )
                return tables if ok else None

            # Drawn at 140 columns first: the tables the narrower terminal must make anew.
            await until(pilot, lambda: fitted(140), what=f":{command} at 140 columns")
            await pilot.resize_terminal(80, 24)
            tables = await until(pilot, lambda: fitted(80), what=f":{command} at 80 columns")
            # A table made anew is given the focus before it is drawn (replace_table, then
            # the redraw): the focus is pending in the app's queue once its rows are in.
            await pilot.pause()
            # The keys still reach the table made anew (before: the focus went with the
            # old one, and Enter did nothing until Tab).
            assert isinstance(app.focused, FleetTable), (command, app.focused)
            for table in app.screen.query(FleetTable):
                assert table.max_scroll_x == 0, (command, table.id, table.virtual_size)
                assert overruns(table) == [], (command, table.id)
            assert tables
            await pilot.press("escape")
