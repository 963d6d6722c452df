"""What every console screen shares: the fleet header, the command line and the footer.

A screen draws itself from a FleetView when the app hands it one; only the screen on
top is redrawn, so a hidden screen costs nothing.
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.screen import Screen

from console.collect.view import FleetView
from console.tui.filtering import Filter
from console.tui.host import ConsoleHost, host_of
from console.tui.widgets.command_line import CommandLine
from console.tui.widgets.footer import StableFooter
from console.tui.widgets.header import FleetHeader
from console.tui.widgets.time_cursor import TimeCursor


class ViewScreen(Screen[None]):
    where = "Nodes"  # the breadcrumb in the header

    def __init__(self) -> None:
        super().__init__()
        self.filter: Filter | None = None
        self.drawn_at = 0.0  # monotonic time of the last draw (for the key-to-screen bench)

    @property
    def console(self) -> ConsoleHost:
        return host_of(self)

    def compose(self) -> ComposeResult:
        yield FleetHeader()
        if self.console.offline:  # a replay: where in the recording, how fast
            yield TimeCursor()
        yield from self.compose_body()
        yield CommandLine()
        yield StableFooter()

    def compose_body(self) -> ComposeResult:
        return iter(())

    def on_mount(self) -> None:
        # Draw as soon as the widgets exist, not at the next refresh tick: a key that
        # opens a screen shows its data at once.
        self.call_after_refresh(self.on_screen_resume)

    def on_screen_resume(self) -> None:
        if self.console.view is not None:
            self.show_view(self.console.view)

    def show_view(self, view: FleetView) -> None:
        headers = self.query(FleetHeader)
        if not headers:
            return  # still composing; the next tick draws it
        if self.filter is not None:
            self.filter.start_draw()
        self.draw(view)
        where = self.where
        if self.filter is not None:  # what the filter kept, so an empty table says why
            where += f"  /{self.filter.text}  {self.filter.counted()}"
        headers.first().show(
            view.summary,
            where,
            self.console.read_only,
            self.console.simulated,
            self.console.replay_label(),
            self.console.source_problem(),
            self.console.source_note(),
            self.console.redraw_s,
            self.console.diagnoses.counts(),
        )
        self.drawn_at = time.monotonic()

    def draw(self, view: FleetView) -> None:
        """Redraw the body from a new view."""
