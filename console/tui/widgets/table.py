"""A DataTable that takes whole row lists each refresh and changes only what changed.

Rows carry named fields for the `/` filter (`util>80`) and a plain-text haystack for
free-text filtering. The cursor stays on the same row key across refreshes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.widgets import DataTable

from console.tui.filtering import Filter


@dataclass
class Row:
    key: str
    cells: tuple[RenderableType, ...]
    fields: dict[str, Any] = field(default_factory=dict)
    text: str = ""


class FleetTable(DataTable[RenderableType]):
    DEFAULT_CSS = "FleetTable { height: 1fr; }"

    def __init__(self, columns: Sequence[tuple[str, int | None]], **kwargs: Any) -> None:
        # No cell padding: widths include one space, which saves a column's worth of
        # characters every few columns at 80x24.
        super().__init__(cursor_type="row", zebra_stripes=False, cell_padding=0, **kwargs)
        self._columns_spec = columns
        self._order: list[str] = []
        self._shown: dict[str, tuple[RenderableType, ...]] = {}
        self.rows_by_key: dict[str, Row] = {}
        self.total = 0

    def on_mount(self) -> None:
        for i, (label, width) in enumerate(self._columns_spec):
            # A one-character margin before the first column, on the header and every row.
            shown = f" {label}" if i == 0 else label
            self.add_column(shown, key=label, width=None if width is None else width + (i == 0))

    def show(self, rows: list[Row], flt: Filter | None = None) -> None:
        for row in rows:
            row.cells = (_margin(row.cells[0]), *row.cells[1:])
        self.total = len(rows)
        visible = [r for r in rows if flt is None or flt.matches(r.fields, r.text)]
        self.rows_by_key = {r.key: r for r in visible}
        keys = [r.key for r in visible]
        if keys != self._order:
            self._rebuild(visible)
            return
        labels = [label for label, _ in self._columns_spec]
        auto = [width is None for _, width in self._columns_spec]
        for row in visible:
            before = self._shown.get(row.key)
            for i, cell in enumerate(row.cells):
                if before is None or _differs(before[i], cell):
                    # Only auto-width columns re-measure: it is costly on big tables.
                    self.update_cell(row.key, labels[i], cell, update_width=auto[i])
            self._shown[row.key] = row.cells

    def _rebuild(self, rows: list[Row]) -> None:
        current = self.selected_key()
        self.clear()
        for row in rows:
            self.add_row(*row.cells, key=row.key)
        self._order = [r.key for r in rows]
        self._shown = {r.key: r.cells for r in rows}
        if current in self._order:
            self.move_cursor(row=self._order.index(current))

    def selected_key(self) -> str | None:
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        return self._order[self.cursor_row]

    def selected(self) -> Row | None:
        key = self.selected_key()
        return self.rows_by_key.get(key) if key else None


def _margin(cell: RenderableType) -> RenderableType:
    if isinstance(cell, Text):
        return Text(" ") + cell
    return f" {cell}" if isinstance(cell, str) else cell


def _differs(a: RenderableType, b: RenderableType) -> bool:
    return str(a) != str(b) or getattr(a, "style", None) != getattr(b, "style", None)
