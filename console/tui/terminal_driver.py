"""The console's terminal driver: Textual's own, writing only the cells that changed.

Textual picks its driver through `App.get_driver_class`; on a POSIX terminal that is
`LinuxDriver`, and `EngineroomApp` asks for this subclass of it instead. Every write goes
through `ScreenDiff` (console/tui/screendiff.py) first. The web view (textual-serve's
driver) and the tests' headless driver are left as they are.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from textual.drivers.linux_driver import LinuxDriver

from console.tui.screendiff import ScreenDiff

if TYPE_CHECKING:
    from textual.app import App


class DiffDriver(LinuxDriver):
    def __init__(self, app: App[Any], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.diff = ScreenDiff()
        # The app writes its frames from its loop; the driver's input thread writes a
        # few modes of its own.
        self._diff_lock = threading.Lock()
        if hasattr(app, "terminal_driver"):  # where the app finds it (for Ctrl+L)
            app.terminal_driver = self

    def write(self, data: str) -> None:
        with self._diff_lock:
            self.diff.resized(_terminal_size())
            data = self.diff.feed(data)
        if data:
            super().write(data)

    def redraw(self) -> None:
        """Forget what the terminal shows: the next frames write every cell they draw."""
        with self._diff_lock:
            self.diff.reset()


def _terminal_size() -> tuple[int, int] | None:
    """The terminal's size as it is now (LinuxDriver writes to stderr); None if not one."""
    for stream in (sys.__stderr__, sys.__stdout__):
        try:
            if stream is not None:
                size = os.get_terminal_size(stream.fileno())
                return size.columns, size.lines
        except (OSError, ValueError):
            continue
    return None
