"""A DataTable that takes whole row lists each refresh and changes only what changed.

Rows carry named fields for the `/` filter (`util>80`) and a plain-text haystack for
free-text filtering. The cursor stays on the same row key across refreshes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from operator import is_
from typing import Any

from rich.console import RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.coordinate import Coordinate
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey
from textual.widgets.data_table import Row as TableRow

from console.tui.filtering import Filter
from console.tui.format import safe

Cells = tuple[RenderableType, ...]
FIRST_ROWS = 120  # added at once on a rebuild, made: more than a screen of rows
LATER_ROWS = 1000  # then this many after each paint, blank until first drawn


Fields = dict[str, Any]


class Row:
    """A table row. `cells` and `fields` may be functions that make them: a table of a
    thousand rows then formats only the rows it draws, and works out the filter's fields
    only when there is a filter (the 2,000 deployments of Models, every refresh)."""

    __slots__ = ("_fields", "_text", "cells", "key")

    def __init__(
        self,
        key: str,
        cells: Cells | Callable[[], Cells],
        fields: Fields | Callable[[], Fields] | None = None,
        text: str | Callable[[], str] = "",
    ) -> None:
        self.key = key
        self.cells = cells
        self._fields = {} if fields is None else fields
        self._text = text

    def made(self) -> Cells:
        if callable(self.cells):
            self.cells = self.cells()
        return self.cells

    @property
    def fields(self) -> Fields:
        if callable(self._fields):
            self._fields = self._fields()
        return self._fields

    @property
    def text(self) -> str:
        if callable(self._text):
            self._text = self._text()
        return self._text


class RowsByKey(Mapping[str, Row]):
    """The table's rows by key, read-only: the rows in order, and where each key is."""

    __slots__ = ("at", "rows")

    def __init__(self, rows: list[Row], at: dict[str, int]) -> None:
        self.rows, self.at = rows, at

    def __getitem__(self, key: str) -> Row:
        return self.rows[self.at[key]]

    def __contains__(self, key: object) -> bool:
        return key in self.at

    def __iter__(self) -> Iterator[str]:
        return iter(self.at)

    def __len__(self) -> int:
        return len(self.at)


def _marked(rows: list[Row], key: str, style: str) -> list[Row]:
    """`rows` with the row of `key` (if there) drawn with its first cell in `style`; the
    list and the rows given are not changed (a screen keeps them for its next draw)."""
    at = next((i for i, r in enumerate(rows) if r.key == key), None)
    if at is None:
        return rows
    row = rows[at]

    def cells() -> Cells:
        made = row.made()
        if not made or not isinstance(made[0], Text):
            return made
        first = made[0].copy()
        first.stylize(style)
        return (first, *made[1:])

    out = rows.copy()
    out[at] = Row(key, cells, lambda: row.fields, lambda: row.text)
    return out


def empty_row(columns: int, why: str) -> Row:
    """The one row of an empty table: "none", and why, in the last column (key "-")."""
    cells = (Text("none", style="dim"), *[Text("")] * (columns - 2), Text(why, style="dim"))
    return Row("-", cells)


class FleetTable(DataTable[RenderableType]):
    DEFAULT_CSS = "FleetTable { height: 1fr; }"
    # (row key, style): the row a screen points at (the top diagnosis's subject); its
    # first cell is drawn in the style. Set before show(); None marks nothing.
    mark: tuple[str, str] | None = None

    def __init__(self, columns: Sequence[tuple[str, int | None]], **kwargs: Any) -> None:
        # Rendered cells kept by the cell object they came from (see _render_cell); made
        # first, since DataTable's __init__ already clears its caches.
        self._rendered: LRUCache[tuple[Any, ...], tuple[object, list[list[Segment]]]] = LRUCache(
            4096
        )
        # Rendered rows kept by the cell objects they came from, and lines by the row they
        # came from (see _render_line_in_row and _render_line).
        self._rows_rendered: LRUCache[tuple[Any, ...], tuple[tuple[object, ...], Any]] = LRUCache(
            1024
        )
        self._lines_rendered: LRUCache[tuple[Any, ...], tuple[object, Strip]] = LRUCache(1024)
        self._widths: tuple[int, ...] = ()  # the columns' widths, as of this frame
        # The rows in order and where each line is, kept until rows are added, removed or
        # sorted (see ordered_rows).
        self._rows_serial = 0
        self._in_order: tuple[tuple[int, int], list[TableRow], list[tuple[RowKey, int]]] | None = (
            None
        )
        # No cell padding: widths include one space, which saves a column's worth of
        # characters every few columns at 80x24.
        super().__init__(cursor_type="row", zebra_stripes=False, cell_padding=0, **kwargs)
        self._columns_spec = columns
        self._order: list[str] = []
        # Each row's cells as added or last updated; None for a row added blank, whose
        # cells are made when it is first drawn (or read): a rebuild of the 20,000
        # deployments of Models at 10,000 nodes made every one before.
        self._shown: dict[str, tuple[RenderableType, ...] | None] = {}
        self._blank: Cells = tuple(Text("") for _ in columns)
        self._column_keys: list[ColumnKey] = []
        self._widest: dict[int, int] = {}  # auto-width columns: the widest cell drawn
        self.rows_by_key = RowsByKey([], {})
        self._waiting: list[Row] = []  # rows still to add after a rebuild
        self._cursor_wanted: str | None = None  # the row the cursor goes back to once added

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._on_theme)
        for i, (label, width) in enumerate(self._columns_spec):
            # A one-character margin before the first column, on the header and every row.
            shown = f" {label}" if i == 0 else label
            self.add_column(shown, key=label, width=None if width is None else width + (i == 0))
        self._column_keys = [column.key for column in self.ordered_columns]

    def show(self, rows: list[Row], flt: Filter | None = None, same_keys: bool = False) -> None:
        """`same_keys`: the caller knows the rows have the keys of the last show, in order
        (a screen that patched its last rows): they are not compared."""
        visible = rows if flt is None else [r for r in rows if flt.matches(r.fields, r.text)]
        if self.mark is not None:
            visible = _marked(visible, *self.mark)
        if same_keys and flt is None and len(visible) == len(self._order):
            self.rows_by_key = RowsByKey(visible, self.rows_by_key.at)
            self._update_on_screen()
            return
        keys = [r.key for r in visible]
        if keys != self._order:
            self.rows_by_key = RowsByKey(visible, {key: i for i, key in enumerate(keys)})
            self._rebuild(visible)
            return
        # The same keys in the same order: where each row is did not change (a dict of
        # 20,000 rows made again each draw was a tenth of opening Models at 10,000 nodes).
        self.rows_by_key = RowsByKey(visible, self.rows_by_key.at)
        self._update_on_screen()

    def _update_on_screen(self) -> None:
        """Redraw changed cells of the rows on screen; the rest wait until scrolled to.

        With a thousand nodes, updating every row each refresh costs more than all the
        polling; a row off screen is brought up to date when it scrolls into view.
        """
        if not self._order:
            return
        top = int(self.scroll_offset.y)
        height = max(1, self.size.height or 50)
        for key in self._order[max(0, top - 2) : top + height + 2]:
            row = self.rows_by_key.get(key)
            if row is None or key not in self._shown:  # not added yet (see _rebuild)
                continue
            cells = _with_margin(row.made())
            before = self._shown.get(key)
            for i, cell in enumerate(cells):
                if before is None or _differs(before[i], cell):
                    self._set_cell(key, i, cell)
            self._shown[key] = cells
            self._fit(cells)

    def _set_cell(self, key: str, column: int, cell: RenderableType) -> None:
        """DataTable.update_cell, repainting that cell only: update_cell repaints the
        whole table (its refresh()), and Textual then wrote every line of it to the
        terminal, each from the table's left edge, at every refresh (issue 28)."""
        row_key = RowKey(key)
        self._data[row_key][self._column_keys[column]] = cell
        self._update_count += 1  # DataTable's own render caches are keyed by it
        row = self._row_locations.get(row_key)
        if row is None:
            return
        # Where the cell is: DataTable's refresh_coordinate sums the heights of every row
        # above it (2,000 on Models at 1,000 nodes, for each cell); every row here is one
        # line (add_row's height).
        columns = self.ordered_columns
        x = self._row_label_column_width + sum(c.get_render_width(self) for c in columns[:column])
        y = row + (self.header_height if self.show_header else 0)
        region = Region(x, y, columns[column].get_render_width(self), 1)
        if self.window_region.overlaps(region):
            self.refresh(region.translate(-self.scroll_offset))

    def _fit(self, cells: Cells) -> bool:
        """Widen an auto-width column that a cell outgrew; True when one was.

        DataTable re-measures a whole column when asked to fit a cell (thousands of
        cells through Rich); the widest cell made so far is known here, and
        `_update_dimensions` sizes the column from it."""
        widened = False
        for i, (_, width) in enumerate(self._columns_spec):
            if width is None and (w := _width(cells[i])) > self._widest.get(i, 0):
                self._widest[i], widened = w, True
        if widened:
            self._require_update_dimensions = True
        return widened

    def _make(self, row_key: RowKey) -> None:
        """A row added blank gets its cells, from the newest Row of its key."""
        row = self.rows_by_key.get(row_key.value or "")
        cells = _with_margin(row.made()) if row is not None else self._blank
        data = self._data[row_key]
        for column_key, cell in zip(self._column_keys, cells, strict=True):
            data[column_key] = cell
        self._shown[row_key.value or ""] = cells
        if self._fit(cells):
            # Drawn at the old width so far: everything is drawn again at the new one.
            self.call_later(self._widen)

    def _widen(self) -> None:
        self._update_count += 1  # DataTable's render caches are keyed by it
        self.refresh()

    def _ensure_made(self, row_key: RowKey | None) -> None:
        if row_key is not None and self._shown.get(row_key.value or "", ()) is None:
            self._make(row_key)

    def get_row(self, row_key: RowKey | str) -> list[RenderableType]:
        self._ensure_made(RowKey(row_key) if isinstance(row_key, str) else row_key)
        return super().get_row(row_key)

    def get_row_at(self, row_index: int) -> list[RenderableType]:
        self._ensure_made(self._row_locations.get_key(row_index))
        return super().get_row_at(row_index)

    def get_cell_at(self, coordinate: Coordinate) -> RenderableType:
        self._ensure_made(self._row_locations.get_key(coordinate.row))
        return super().get_cell_at(coordinate)

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        """DataTable renders every cell on screen again once any cell of the table changed
        (an update counter is part of its cache key): at each refresh, a screen of cells
        through Rich, most of them unchanged. A cell here keeps its object until its
        value changes (`_update_on_screen` replaces only cells that differ), so what the
        object rendered to is kept by the object's identity instead."""
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:  # the header, or a row label
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        self._ensure_made(row_key)  # a row added blank, drawn for the first time
        cell = self._data[row_key][column_key]
        key = (
            row_key,
            column_key,
            row_index,
            base_style,
            width,
            cursor,
            hover,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        kept = self._rendered.get(key)
        if kept is not None and kept[0] is cell:
            return kept[1]
        lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        self._rendered[key] = (cell, lines)
        return lines

    # DataTable renders every row and line on screen again, too, once any cell of the
    # table changed: a screen of lines, 0.7-1 ms each, for the handful whose cells did
    # (45 ms for the first frame of Models at 10,000 nodes, and again each refresh while
    # it is shown). Here a row is kept while its cells are the same objects, and a line
    # while its row is.
    def render_lines(self, crop: Region) -> list[Strip]:
        self._widths = tuple(column.get_render_width(self) for column in self.ordered_columns)
        return super().render_lines(crop)

    def _render_line_in_row(
        self,
        row_key: RowKey,
        line_no: int,
        base_style: Style,
        cursor_location: Coordinate,
        hover_location: Coordinate,
    ) -> tuple[Any, Any]:
        row_index = self._row_locations.get(row_key)
        if row_index is None or self.cursor_type != "row":  # the header
            return super()._render_line_in_row(
                row_key, line_no, base_style, cursor_location, hover_location
            )
        self._ensure_made(row_key)
        cells = tuple(self._data[row_key].values())
        key = (
            row_key,
            line_no,
            row_index,
            base_style,
            cursor_location.row == row_index,  # a row cursor: only its own row shows
            hover_location.row == row_index,
            self.show_cursor,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self.size.width,
            self._widths,
        )
        kept = self._rows_rendered.get(key)
        if kept is not None and len(kept[0]) == len(cells) and all(map(is_, kept[0], cells)):
            return kept[1]
        pair = super()._render_line_in_row(
            row_key, line_no, base_style, cursor_location, hover_location
        )
        self._rows_rendered[key] = (cells, pair)
        return pair

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        try:
            row_key, line_no = self._get_offsets(y)
        except LookupError:
            return super()._render_line(y, x1, x2, base_style)
        pair = self._render_line_in_row(
            row_key, line_no, base_style, self.cursor_coordinate, self.hover_coordinate
        )
        key = (y, x1, x2, self.size.width, base_style)
        kept = self._lines_rendered.get(key)
        if kept is not None and kept[0] is pair:
            return kept[1]
        strip = super()._render_line(y, x1, x2, base_style)
        self._lines_rendered[key] = (pair, strip)
        return strip

    def _clear_caches(self) -> None:
        super()._clear_caches()
        self._rendered.clear()
        self._rows_rendered.clear()
        self._lines_rendered.clear()
        self._in_order = None

    # DataTable keeps the rows in order, and the line each is on, only until any cell
    # changes (its update counter): each refresh that changed one cell on screen walked
    # every row twice at the next paint, the 21,000 of Models at 10,000 nodes (about 20 ms
    # a paint). Here they are kept until the rows themselves change.
    @property
    def ordered_rows(self) -> list[TableRow]:
        return self._rows_in_order()[1]

    @property
    def _y_offsets(self) -> list[tuple[RowKey, int]]:
        return self._rows_in_order()[2]

    def _rows_in_order(self) -> tuple[tuple[int, int], list[TableRow], list[tuple[RowKey, int]]]:
        key = (self.row_count, self._rows_serial)
        kept = self._in_order
        if kept is None or kept[0] != key:
            rows = self.rows
            keys = map(self._row_locations.get_key, range(key[0]))
            ordered = [rows[k] for k in keys if k is not None]
            lines = [(row.key, y) for row in ordered for y in range(row.height)]
            kept = self._in_order = (key, ordered, lines)
        return kept

    def add_row(self, *cells: RenderableType, **kwargs: Any) -> RowKey:
        self._rows_serial += 1
        return super().add_row(*cells, **kwargs)

    def remove_row(self, row_key: RowKey | str) -> None:
        self._rows_serial += 1
        super().remove_row(row_key)

    def sort(self, *columns: ColumnKey | str, **kwargs: Any) -> FleetTable:
        self._rows_serial += 1
        super().sort(*columns, **kwargs)
        self._rows_serial += 1
        return self

    def clear(self, columns: bool = False) -> FleetTable:
        self._rows_serial += 1
        super().clear(columns)
        self._rows_serial += 1
        return self

    def _on_theme(self, theme: object) -> None:
        """The kept cells go with the theme, which changes the component classes' styles
        (cursor, header...); the rest of what a cell's rendering depends on is in its key.
        They are not dropped on Textual's style updates: it sends one on every screen
        switch and focus change, and a screen of cells went through Rich again on each
        key press that switched screens."""
        self._rendered.clear()
        self._rows_rendered.clear()
        self._lines_rendered.clear()
        self.refresh()

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """Size the table without measuring every new cell.

        DataTable measures each cell of each new row through Rich (about 9 µs a cell: half
        a second for the 2,000 deployments of Models at 1,000 nodes, on the key press that
        opens it). Fixed-width columns need no measuring, and `_rebuild` already knows the
        widest cell of each auto-width column.
        """
        for i, column in enumerate(self.ordered_columns):
            if i in self._widest:
                column.content_width = max(column.content_width, self._widest[i])
        super()._update_dimensions(())

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.call_after_refresh(self._update_on_screen)

    def _rebuild(self, rows: list[Row]) -> None:
        """Fill the table anew: the first FIRST_ROWS rows now, the rest a chunk at a time
        once the screen has drawn. Opening Models at 1,000 nodes added 2,000 rows before
        the first paint (a quarter of a second on the key that opened it)."""
        current = self.selected_key() or self._cursor_wanted
        self.clear()
        self._order = [r.key for r in rows]
        self._shown = {}
        self._widest = {}
        self._waiting = rows
        self._cursor_wanted = current
        self._add_rows(FIRST_ROWS)

    def _add_rows(self, count: int, made: bool = True) -> None:
        """Add the next `count` rows waiting; `made`: with their cells, else blank."""
        rows, self._waiting = self._waiting[:count], self._waiting[count:]
        for row in rows:
            cells = _with_margin(row.made()) if made else None
            self.add_row(*(cells or self._blank), key=row.key)
            self._shown[row.key] = cells
            if cells is not None:
                self._fit(cells)
        wanted = self._cursor_wanted
        if wanted is not None and wanted in self._shown:
            self.move_cursor(row=self._order.index(wanted))
            self._cursor_wanted = None
        if self._waiting:
            self.call_after_refresh(self._add_rows, LATER_ROWS, False)
        else:
            self._cursor_wanted = None

    def selected_key(self) -> str | None:
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        return self._order[self.cursor_row]

    def selected(self) -> Row | None:
        key = self.selected_key()
        return self.rows_by_key.get(key) if key else None


def _width(cell: RenderableType) -> int:
    return cell.cell_len if isinstance(cell, Text) else len(str(cell))


def _with_margin(cells: Cells) -> Cells:
    """A one-character margin before the first column; and every cell safe for the
    terminal, since its text is a node's, an engine's, a job's (console.core.safetext):
    the one place every table's cells pass, made only for the rows drawn. A str becomes
    plain Text: never read as markup."""
    first, *rest = map(_safe, cells)
    if isinstance(first, Text):
        first = Text(" ") + first
    return (first, *rest)


def _safe(cell: RenderableType) -> RenderableType:
    if isinstance(cell, Text):
        plain = cell.plain
        if plain.isascii() and plain.isprintable():  # most cells: nothing to look at
            return cell
        return safe(cell)
    return safe(cell) if isinstance(cell, str) else cell


def _differs(a: RenderableType, b: RenderableType) -> bool:
    if isinstance(a, Text) and isinstance(b, Text):
        # Colour lives in spans as well as the base style: a value that turns red
        # without changing its text must still be redrawn.
        return a.plain != b.plain or a.style != b.style or a.spans != b.spans
    return str(a) != str(b)
