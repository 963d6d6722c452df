"""Textual's Footer, composed again only when what it shows changed.

Textual recomposes a screen's Footer whenever its bindings may have changed: on every
screen switch and every focus change, so twice per key that changes the screen. Each
time every key is unmounted, mounted and styled again, which at 1,000 nodes was a good
part of a key press's time to screen, for a footer that shows the same keys as before.
"""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


class StableFooter(Footer):
    def __init__(self) -> None:
        super().__init__()
        self._composed_for: tuple[object, ...] | None = None

    def bindings_changed(self, screen: Screen) -> None:
        shown = self._shows(screen)
        will_compose = screen.app.app_focus and self.is_attached and screen is self.screen
        if will_compose and shown == self._composed_for:
            return  # the same keys, descriptions and states: nothing to redraw
        if will_compose:
            self._composed_for = shown
        super().bindings_changed(screen)

    def _shows(self, screen: Screen) -> tuple[object, ...]:
        """What compose would draw from: each shown binding, its key as displayed, and
        whether it is enabled."""
        app = screen.app
        return tuple(
            (binding.action, app.get_key_display(binding), binding.description, enabled, tip)
            for _, binding, enabled, tip in screen.active_bindings.values()
            if binding.show
        )
