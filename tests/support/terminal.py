"""A real terminal for the console: tmux runs it at a set size, the test types with
send-keys and reads the screen as the terminal drew it with capture-pane.

The snapshot tests render through Textual's own pilot, which missed that typed text was
invisible in a real terminal (issue 28). This reads the cells a person would see.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.engines.servers import running

TMUX = shutil.which("tmux")


class Terminal:
    """`argv` in a tmux session of `width`x`height`, on a tmux server of its own."""

    def __init__(
        self,
        argv: Sequence[str],
        size: tuple[int, int],
        env: Mapping[str, str],
        cwd: Path,
    ) -> None:
        if TMUX is None:
            raise RuntimeError("tmux is not installed (make test installs it)")
        self.socket = f"er-test-{uuid.uuid4().hex[:10]}"
        self.size = size
        self.env = {**env, "TERM": "xterm-256color"}
        self.env.pop("TMUX", None)
        width, height = size
        # The environment reaches the console through `env`: tmux's own server would
        # otherwise hand it the server's, not this test's.
        command = (
            "exec env -i "
            + " ".join(shlex.quote(f"{k}={v}") for k, v in self.env.items())
            + " "
            + shlex.join(argv)
        )
        # The server's options come from its own file, read before the pane starts: a
        # program that ends at once still leaves its pane (and what it said) to read.
        self.conf = Path(tempfile.mkdtemp(prefix="er-tmux-")) / "tmux.conf"
        self.conf.write_text("set -g remain-on-exit on\nset -g history-limit 100\n")
        self._tmux(
            "new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height),
            "-c", str(cwd), command,
        )  # fmt: skip
        self.pid = int(self._tmux("display", "-p", "-t", "t", "#{pane_pid}"))

    def _tmux(self, *args: str) -> str:
        assert TMUX is not None
        done = subprocess.run(
            [TMUX, "-L", self.socket, "-f", str(self.conf), *args],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def screen(self) -> list[str]:
        """The rows as the terminal shows them now."""
        return self._tmux("capture-pane", "-p", "-t", "t").splitlines()

    def cursor(self) -> tuple[int, int]:
        """Where the terminal's cursor is (column, row), shown or not: Textual puts it in
        the focused input, so a test can wait for the focus to arrive there."""
        x, y = self._tmux("display", "-p", "-t", "t", "#{cursor_x} #{cursor_y}").split()
        return int(x), int(y)

    def wait_for_cursor_on(self, text: str, timeout: float = 30.0) -> None:
        """Wait until the cursor is on the row that shows `text` (a focused field)."""

        def there(rows: list[str]) -> bool:
            _, y = self.cursor()
            return y < len(rows) and text in rows[y]

        self.wait_for(there, timeout, what=f"the cursor on the row of {text!r}")

    def exited(self) -> bool:
        """Whether the program in the terminal has ended (tmux keeps its pane)."""
        return self._tmux("display", "-p", "-t", "t", "#{pane_dead}").strip() == "1"

    def wait_exit(self, timeout: float = 30.0, what: str = "the program ended") -> None:
        deadline = time.monotonic() + timeout
        while not self.exited():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout} s; it shows:\n{self.text()}")
            time.sleep(0.1)

    def text(self) -> str:
        return "\n".join(self.screen())

    def keys(self, *keys: str) -> None:
        """tmux key names: "Escape", "Enter", "Tab", "C-c" ..."""
        self._tmux("send-keys", "-t", "t", *keys)

    def type(self, text: str) -> None:
        """Characters, each sent as typed (never read as a key name)."""
        self._tmux("send-keys", "-t", "t", "-l", text)

    def wait_for(
        self, found: str | Callable[[list[str]], object], timeout: float = 30.0, what: str = ""
    ) -> object:
        """Wait until the screen shows `found` (a text, or a predicate over the rows);
        fail with the last screen after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.screen()
            result = ("\n".join(rows).find(found) >= 0) if isinstance(found, str) else found(rows)
            if result:
                return result
            if time.monotonic() > deadline:
                shown = "\n".join(rows)
                raise AssertionError(
                    f"{what or found!r} not on the {self.size[0]}x{self.size[1]} screen "
                    f"within {timeout} s; it shows:\n{shown}"
                )
            time.sleep(0.1)

    def close(self) -> None:
        """Kill the terminal; the program in it gets SIGHUP. One still running 20 s later
        is killed, so that no test leaves a console behind (and the test that needs it
        to leave on its own checks that itself)."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._tmux("kill-server")
        shutil.rmtree(self.conf.parent, ignore_errors=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if not running(self.pid):  # a zombie has ended: init reaps it a second later
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def console_env(**extra: str) -> dict[str, str]:
    """The console's environment in a terminal: this process's, less NO_COLOR."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TMUX")}
    env.update(extra)
    return env
