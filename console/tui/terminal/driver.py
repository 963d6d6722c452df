"""The console's terminal driver: Textual's own, writing only the cells that changed.

Textual picks its driver through `App.get_driver_class`; on a POSIX terminal that is
`LinuxDriver`, and `EngineroomApp` asks for this subclass of it instead. Every write goes
through `ScreenDiff` (console/tui/terminal/screendiff.py) first. The web view (textual-serve's
driver) and the tests' headless driver are left as they are. It also watches for its
terminal hanging up without a SIGHUP reaching the console (`_watch_hangup`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from textual.drivers.linux_driver import LinuxDriver

from console.tui.terminal.screendiff import ScreenDiff

if TYPE_CHECKING:
    from textual.app import App

HANGUP_POLL_MS = 500  # how often the terminal is checked for a hang-up
# The longest a console lives on after its terminal hung up, whatever its event loop does:
# twice the app's own exit deadline (console.tui.app.EXIT_GRACE_S), which a loop that
# handles the hang-up meets first.
HANGUP_DEADLINE_S = 10.0


class DiffDriver(LinuxDriver):
    def __init__(self, app: App[Any], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.diff = ScreenDiff()
        # The app writes its frames from its loop; the driver's input thread writes a
        # few modes of its own.
        self._diff_lock = threading.Lock()
        if hasattr(app, "terminal_driver"):  # where the app finds it (for Ctrl+L)
            app.terminal_driver = self
        self._hangup_done = threading.Event()

    def start_application_mode(self) -> None:
        super().start_application_mode()
        self._hangup_done.clear()
        threading.Thread(target=self._watch_hangup, name="terminal-hangup", daemon=True).start()

    def stop_application_mode(self) -> None:
        self._hangup_done.set()
        super().stop_application_mode()

    def _watch_hangup(self) -> None:
        """A terminal that closed under the console (its tmux server or SSH session gone)
        hangs up its input. The kernel sends SIGHUP only to the processes of the session it
        controls; a console started otherwise got none, and Textual's input thread then
        read end-of-file in a busy loop (a replay left behind spun a core for 35 minutes).
        At the hang-up the console sends itself SIGHUP: its handler leaves cleanly
        (EngineroomApp._hung_up), and a process without one ends."""
        poller = select.poll()
        poller.register(self.fileno, select.POLLHUP)
        while not self._hangup_done.is_set():
            try:
                events = poller.poll(HANGUP_POLL_MS)
            except OSError:
                return
            if any(mask & select.POLLHUP for _, mask in events):
                self._leave_after_hangup()
                return

    def _leave_after_hangup(self) -> None:
        """What is still written goes to /dev/null; SIGHUP asks the console to leave
        cleanly; and it leaves by HANGUP_DEADLINE_S for sure. Its event loop can be blocked
        behind the dead terminal (most likely on Textual's writer queue, its thread gone), and
        then never runs the SIGHUP handler: one console in about 60 outlived its hung-up
        terminal for good in tests/test_tui_terminal.py. This thread ends it, after the
        app's cleanup (the demo stops its simulated fleet)."""
        output_to_devnull()
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(HANGUP_DEADLINE_S)
        cleanup = getattr(self._app, "exit_watchdog", None)
        if cleanup is not None:
            with contextlib.suppress(Exception):
                cleanup()
        os._exit(129)  # 128 + SIGHUP, as the app's own hang-up exit

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


def output_to_devnull() -> None:
    """What is still written to stdout and stderr goes to /dev/null: a write to a hung-up
    terminal fails or blocks."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(devnull, fd)
    os.close(devnull)


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
