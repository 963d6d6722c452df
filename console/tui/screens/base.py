"""What every console screen shares: the fleet header, the command line and the footer.

A screen draws itself from a ViewBuilt (console/tui/built.py: the FleetView and all else
it shows) when the app hands it one; only the screen on top is redrawn, so a hidden
screen costs nothing.
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.screen import Screen

from console.tui.built import ViewBuilt
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
        # The last view the app handed (EngineroomApp.tick, or on coming on top): all this
        # screen draws from; it never asks the app for data.
        self.built: ViewBuilt | None = None

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
        # opens a screen shows its data at once (the app handed it the last view).
        self.call_after_refresh(self.on_screen_resume)

    def on_screen_resume(self) -> None:
        self.redraw()

    def redraw(self) -> bool:
        """Draw again from the last view handed (a filter, a resize); False before any."""
        if self.built is None:
            return False
        self.show_built(self.built)
        return True

    def show_built(self, built: ViewBuilt) -> None:
        """Draw this view, and keep it to draw again from."""
        self.built = built
        headers = self.query(FleetHeader)
        if not headers:
            return  # still composing; the next tick draws it
        if self.filter is not None:
            self.filter.start_draw()
        self.draw(built)
        where = self.where
        if self.filter is not None:  # what the filter kept, so an empty table says why
            where += f"  /{self.filter.text}  {self.filter.counted()}"
        h = built.header
        headers.first().show(built.view.summary, where, h.read_only, h.simulated,
                             h.replay_label, h.source_problem, h.source_note, h.redraw_s,
                             built.findings.counts)  # fmt: skip
        self.drawn_at = time.monotonic()

    def draw(self, built: ViewBuilt) -> None:
        """Redraw the body from a new view."""
