"""Two widgets' shortcuts, checked against the long way: the GPU grid's lines (each node's
cells wrapped at the width, a node with no GPU on no line, the label on a node's first
line only; console/tui/widgets/gpu_grid.py) and the fleet table's kept cells, rows and
lines."""

from __future__ import annotations

from console.collect.views.view import GpuCell
from console.core.snapshot import Gpu
from console.tui.widgets.gpu_grid import GpuGrid


def cells(node: str, n: int) -> list[GpuCell]:
    return [GpuCell(node, "up", Gpu(index=i, utilization_pct=float(i))) for i in range(n)]


def test_each_line_holds_its_nodes_next_cells_and_the_label_starts_a_node():
    by_node = [(f"n{i}", cells(f"n{i}", n)) for i, n in enumerate([0, 8, 0, 0, 45, 1, 0])]
    grid = GpuGrid()
    grid.show(by_node, 90.0)
    per_line = grid._per_line
    assert 1 < per_line < 45  # the 45-GPU node wraps
    # What the lines must be: each node's cells in chunks of per_line, in order.
    expected = []
    for node, node_cells in by_node:
        for start in range(0, len(node_cells), per_line):
            expected.append((node if start == 0 else "", node_cells[start : start + per_line]))
    assert grid._lines == len(expected)
    assert [grid._line(i) for i in range(grid._lines)] == expected
    assert grid.virtual_size.height == len(expected)


def test_a_fleet_without_gpus_says_so_on_one_line():
    grid = GpuGrid()
    grid.show([("n0", [])], 90.0)
    assert grid._lines == 0 and grid.virtual_size.height == 1
    assert grid.render_line(0).text.strip() == "no GPUs reported"


async def test_a_tables_kept_cells_outlive_a_screen_switch_but_not_a_theme():
    """FleetTable keeps rendered cells by identity (console/tui/widgets/table.py); Textual
    notifies a style update on every screen switch, which must not drop them, while a
    theme that changes the cursor's or the header's style must."""
    from rich.text import Text
    from textual.app import App, ComposeResult

    from console.tui.widgets.table import FleetTable, Row

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield FleetTable([("name", 10), ("value", None)])

    app = One()
    async with app.run_test(size=(40, 10)) as pilot:
        table = app.query_one(FleetTable)
        table.show([Row(f"r{i}", (Text(f"r{i}"), Text(str(i)))) for i in range(5)])
        await pilot.pause()
        keys = list(table._rendered.keys())
        before = {key: table._rendered.get(key) for key in keys}
        assert before
        table.notify_style_update()  # what a screen switch does: the same styles
        await pilot.pause()
        assert all(table._rendered.get(key) is kept for key, kept in before.items())
        app.theme = "textual-light" if app.theme != "textual-light" else "textual-dark"
        await pilot.pause()
        # The theme changes the cursor's and the header's styles: every cell made anew.
        assert all(table._rendered.get(key) is not kept for key, kept in before.items())


async def test_a_tables_kept_rows_and_lines_show_what_a_table_without_them_shows():
    """FleetTable keeps rendered rows while their cells are the same objects, and lines
    while their rows are (console/tui/widgets/table.py): after a cell changes, the cursor
    moves and the table scrolls, each line on screen is what DataTable renders with no
    cache of its own."""
    from rich.text import Text
    from textual.app import App, ComposeResult
    from textual.widgets import DataTable

    from console.tui.widgets.table import FleetTable, Row

    columns = [("name", 10), ("value", None)]

    class Two(App[None]):
        CSS = "DataTable { height: 10; }"

        def compose(self) -> ComposeResult:
            yield FleetTable(columns, id="kept")
            yield DataTable(cursor_type="row", cell_padding=0, id="plain")

    def rows(values: list[int]) -> list[Row]:
        return [Row(f"r{i}", (Text(f"r{i}"), Text(str(v)))) for i, v in enumerate(values)]

    def lines(table: DataTable) -> list[list[tuple[str, str]]]:  # the text and its style
        return [
            [(seg.text, str(seg.style)) for seg in table.render_line(y)]
            for y in range(table.size.height)
        ]

    app = Two()
    async with app.run_test(size=(40, 24)) as pilot:
        kept, plain = app.query_one(FleetTable), app.query_one("#plain", DataTable)
        for i, (label, width) in enumerate(columns):  # as FleetTable adds them
            first = i == 0 and width is not None
            plain.add_column(
                f" {label}" if i == 0 else label, key=label, width=width and width + first
            )
        values = list(range(30))

        def show() -> None:
            kept.show(rows(values))
            plain.clear()
            for row in rows(values):
                name, value = row.made()
                plain.add_row(Text(" ") + name, value, key=row.key)

        async def same() -> None:
            app.set_focus(None)  # the focused table draws its header and cursor apart
            await pilot.pause()
            plain.move_cursor(row=kept.cursor_row)
            plain.scroll_to(y=kept.scroll_offset.y, animate=False)
            await pilot.pause()
            assert lines(kept) == lines(plain)

        show()
        await same()
        assert len(kept._rows_rendered) and len(kept._lines_rendered)
        values[2] = 2000  # one cell changes, wider than the column was
        show()
        await same()
        assert any("2000" in text for line in lines(kept) for text, _ in line)
        kept.move_cursor(row=3)
        await same()
        kept.move_cursor(row=25)  # scrolls
        await same()
