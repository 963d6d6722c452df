"""The console in a real pseudo-terminal: it leaves when the SSH session drops, and
honours NO_COLOR."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.engines.servers import free_port

FLEET = """\
[fleet]
name = "tty"
[[nodes]]
name = "n1"
agent = "http://127.0.0.1:{port}"
token_env = "T_TTY"
"""


def spawn_console(tmp_path, **env: str) -> tuple[int, int]:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.format(port=free_port()))
    pid, fd = pty.fork()
    if pid == 0:  # the child: the console on the pty, as over SSH
        child_env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        child_env.update(
            T_TTY="token-0123456789", TERM="xterm-256color", COLUMNS="100", LINES="30", **env
        )
        os.chdir(ROOT)
        os.execve(
            sys.executable, [sys.executable, "-m", "console.cli", "--fleet", str(fleet)], child_env
        )
    return pid, fd


def read_drawn(fd: int, timeout: float = 30.0, quiet_s: float = 0.5) -> bytes:
    """What the console wrote until it drew the fleet (node n1) and then wrote nothing
    for `quiet_s`: its first whole screen."""
    out = b""
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    while time.monotonic() < deadline:
        if b"n1" in out and time.monotonic() - last >= quiet_s:
            break
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
            last = time.monotonic()
    return out


def wait_exit(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    return None


def test_the_console_leaves_cleanly_when_the_terminal_goes_away(tmp_path):
    pid, fd = spawn_console(tmp_path)
    try:
        screen = read_drawn(fd)
        assert b"n1" in screen  # it drew the fleet
        os.close(fd)  # the SSH session drops: the kernel hangs up the terminal
        status = wait_exit(pid, 10)
        assert status is not None, "the console kept running after its terminal went away"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_the_console_leaves_when_its_terminal_hangs_up_without_a_sighup(tmp_path):
    """The pty is the console's stdin, stdout and stderr but not its controlling
    terminal (a new session that never opened it), so closing the other end sends it no
    SIGHUP: only its input hangs up. Textual's input thread then read end-of-file in a
    busy loop for good (a replay left so spun a core for 35 minutes); the console now
    sees the hang-up and leaves as it does on SIGHUP (129)."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.format(port=free_port()))
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(T_TTY="token-0123456789", TERM="xterm-256color", COLUMNS="100", LINES="30")
    console = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "--fleet", str(fleet)],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    try:
        assert b"n1" in read_drawn(master)  # it drew the fleet
        assert os.getsid(console.pid) == console.pid  # its own session, no terminal of it
        os.close(master)  # the far end goes: the console's input hangs up, no signal
        assert console.wait(15) == 129
    finally:
        if console.poll() is None:
            console.kill()
            console.wait(10)


@pytest.mark.parametrize("no_color", [False, True])
def test_no_color_drops_colours(tmp_path, no_color):
    pid, fd = spawn_console(tmp_path, **({"NO_COLOR": "1"} if no_color else {}))
    try:
        screen = read_drawn(fd)
    finally:
        os.kill(pid, signal.SIGTERM)
        if wait_exit(pid, 10) is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert b"n1" in screen
    hues = [c for c in colours_in(screen) if not is_grey(c)]
    if no_color:
        assert hues == []  # Textual renders NO_COLOR as shades of grey
    else:
        assert hues  # the same screen, coloured: the check above can fail


GREYS_256 = {0, 7, 8, 15, 16, 231, *range(232, 256)}


def colours_in(screen: bytes) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for params in re.findall(rb"\x1b\[([0-9;]*)m", screen):
        fields = [int(f) for f in params.split(b";") if f]
        i = 0
        while i < len(fields):
            if fields[i] in (38, 48) and i + 2 < len(fields) and fields[i + 1] == 5:
                out.append((fields[i + 2],))
                i += 3
            elif fields[i] in (38, 48) and i + 4 < len(fields) and fields[i + 1] == 2:
                out.append(tuple(fields[i + 2 : i + 5]))
                i += 5
            else:
                i += 1
    return out


def is_grey(colour: tuple[int, ...]) -> bool:
    if len(colour) == 1:
        return colour[0] in GREYS_256
    return colour[0] == colour[1] == colour[2]


def test_the_console_always_leaves_when_its_ssh_session_is_killed(tmp_path):
    """tmux killed under the console (the SSH session gone), eight times. About one time
    in eight the console outlived its terminal for good: Textual's exit blocked writing
    to the dead tty, and SIGTERM could not reach it (issue 28's typing tests left four
    such consoles behind). Now what is still written goes to /dev/null and a watchdog
    ends the process within EXIT_GRACE_S."""
    from console.tui.app import EXIT_GRACE_S
    from tests.engines.servers import running
    from tests.support.terminal import TMUX, Terminal, console_env

    if TMUX is None:
        pytest.skip("tmux is not installed (make test does)")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        FLEET.format(port=free_port()).replace('name = "tty"', 'name = "tty"\nrefresh_s = 0.2')
    )
    argv = [sys.executable, "-m", "console.cli", "--fleet", str(fleet)]
    for _ in range(8):
        term = Terminal(argv, (80, 24), console_env(T_TTY="token-0123456789"), ROOT)
        term.wait_for("n1", what="the fleet drawn")
        pid = term.pid
        term._tmux("kill-server")  # the terminal hangs up under the console
        deadline = time.monotonic() + EXIT_GRACE_S + 10
        while time.monotonic() < deadline:
            if not running(pid):  # exited (init reaps it later)
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("the console outlived its terminal")
