"""Which of a table's columns fit the terminal, and the room left for its last one.

A table has columns of fixed width and at most one of free width, the last (ENGINES,
PROCESSES, RUNS, REASON). Where they do not all fit, a screen drops whole columns, those
it can spare first, and says which ("hidden at this width, widen to see: ..."), instead
of letting the terminal cut one mid-value; the free column gets the room that is left,
and its cells are cut to it with an ellipsis (format.fit). The screens' tables have no
cell padding: each fixed width counts the one space that separates a value from the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static

from console.tui.format import fit
from console.tui.widgets.table import FleetTable

Spec = Sequence[tuple[str, int | None]]
SCROLLBAR = 2  # Textual's vertical scrollbar, there once the rows overflow
MARGIN = 1  # the table's margin before its first column
MIN_ROOM = 16  # the least a free-width column is given before fixed ones go


@dataclass(frozen=True, slots=True)
class Layout:
    shown: tuple[int, ...]  # the spec's columns that fit, in order
    hidden: tuple[str, ...]  # the labels of those that do not, on one line each
    room: int  # the free-width column's width (0: it has none)
    every: bool  # nothing hidden: cells are passed through as they are

    def columns(self, spec: Spec) -> list[tuple[str, int | None]]:
        return [spec[i] for i in self.shown]

    def pick(self, cells: tuple[Any, ...]) -> tuple[Any, ...]:
        """A row's cells for the columns shown."""
        return cells if self.every else tuple(cells[i] for i in self.shown)

    def note(self) -> str:
        """What a screen says under its table: "" when every column shows."""
        if self.every:
            return ""
        return f"hidden at this width, widen to see: {', '.join(self.hidden)}"


def layout(spec: Spec, width: int, spare: Sequence[int] = ()) -> Layout:
    """The columns of `spec` that fit `width` characters. `spare`: the columns that go
    first, in that order; after them, the rest from the right. The first column stays."""
    free = next((i for i, (_, w) in enumerate(spec) if w is None), None)
    order = [*spare, *(i for i in reversed(range(1, len(spec))) if i not in spare and i != free)]
    shown = set(range(len(spec)))

    def used() -> int:
        return MARGIN + SCROLLBAR + sum(spec[i][1] or 0 for i in shown)

    for i in order:
        need = used() + (MIN_ROOM if free is not None else 0)
        if need <= width:
            break
        shown.discard(i)
    room = max(0, width - used()) if free is not None else 0
    kept = tuple(sorted(shown))
    hidden = tuple(spec[i][0].replace("\n", " ") for i in range(len(spec)) if i not in shown)
    return Layout(kept, hidden, room, len(kept) == len(spec))


async def replace_table(old: FleetTable, new: FleetTable) -> None:
    """`new` where `old` was (its columns differ: a table's columns are set as it mounts).
    The keys go where they went: a table that had the focus hands it to its successor
    (before, a terminal resized over SSH left Enter and the arrows going nowhere)."""
    parent = old.parent
    assert isinstance(parent, Widget)
    siblings = list(parent.children)
    after = siblings[siblings.index(old) + 1] if siblings[-1] is not old else None
    focused = old.has_focus
    await old.remove()
    if after is not None:
        await parent.mount(new, before=after)
    else:
        await parent.mount(new)
    if focused:
        new.focus()


class Fitted:
    """One table of a screen, laid out for the terminal's width (`layout`) and laid out
    again when the width calls for other columns: the table is made anew (its columns
    are set as it mounts) and `redraw` draws it. A line under it names what is hidden."""

    def __init__(
        self,
        screen: Screen[Any],
        spec: Spec,
        table_id: str,
        redraw: Callable[[], None],
        spare: Sequence[int] = (),
        **table: Any,
    ) -> None:
        self.screen, self.spec, self.id, self.spare = screen, spec, table_id, spare
        self.redraw, self.options = redraw, table
        self.fit = layout(spec, screen.app.size.width, spare)
        self.busy = False
        self._noted = 0  # the width the note was cut to

    def compose(self) -> Iterator[Widget]:
        yield FleetTable(self.fit.columns(self.spec), id=self.id, **self.options)
        note = Static(self._note(), id=f"{self.id}-hidden", classes="hidden-columns")
        note.styles.height = 1
        note.display = not self.fit.every
        yield note

    def _note(self) -> Text:
        # One line: at 80 columns the names run past it, and the ellipsis says so.
        self._noted = width = self.screen.app.size.width
        return fit(self.fit.note(), width, "dim italic")

    def ready(self) -> bool:
        """Whether the table may be drawn now: False while it is laid out again, and when
        the width changed (it is laid out again, then drawn)."""
        if self.busy:
            return False
        width = self.screen.app.size.width
        laid = layout(self.spec, width, self.spare)
        if laid == self.fit:
            if width != self._noted and not laid.every:  # the note is cut to the width
                self.screen.query_one(f"#{self.id}-hidden", Static).update(self._note())
            return True
        # Other columns, or another room for the free one: a table made anew, since a
        # free-width column never narrows once a cell widened it (FleetTable._fit).
        self.fit, self.busy = laid, True
        self.screen.call_after_refresh(self._relayout)
        return False

    async def _relayout(self) -> None:
        try:
            old = self.screen.query_one(f"#{self.id}", FleetTable)
            await replace_table(
                old, FleetTable(self.fit.columns(self.spec), id=self.id, **self.options)
            )
            note = self.screen.query_one(f"#{self.id}-hidden", Static)
            note.update(self._note())
            note.display = not self.fit.every
        finally:
            self.busy = False
        self.redraw()
