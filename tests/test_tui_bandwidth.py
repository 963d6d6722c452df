"""Light on an SSH link (issue 28): the console writes to its terminal only what changed.

An idle Fleet screen wrote 120 kbit/s on a small fleet and 244 kbit/s at 1,000 nodes:
Textual repainted the header, the GPU grid and every changed table cell's whole table,
and sent each dirty line from its widget's left edge. Now a widget repaints only what it
shows differently, and the console's terminal driver (console/tui/terminal/screendiff.py) writes
only the cells that differ from what the terminal shows. These run the real console in
a real terminal (tmux, whose pipe-pane hands over every byte the console wrote) on real
agents; bench/console_bandwidth.py measures the 1,000-node fleet.

The judge of the diffed stream is a real terminal too: tmux is handed Textual's stream as
it was and the diffed one, and the two screens, characters and attributes, must be the
same.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import termios
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from console.collect.sources.collector import DOWN_AFTER, STALE_AFTER
from console.tui.terminal.screendiff import ScreenDiff
from tests.conftest import ROOT, VIEWER
from tests.engines.servers import free_port, stop, wait_until
from tests.support.terminal import TMUX, Terminal, console_env

pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make test does)")

SIZE = (200, 50)
TEXTUAL_DRIVER = "textual.drivers.linux_driver:LinuxDriver"  # Textual's own, undiffed
# Before: 1,266 bytes a refresh (the header and the GPU grid repainted every second).
IDLE_BYTES_PER_REFRESH = 250
WINDOW_S = 6.0
FRESH_SLACK_S = 1.5
FLEET = """\
[fleet]
name = "link"
refresh_s = 1

[agent]
state_dir = "{state}"
scrape_interval_s = 1
discover = false
"""
NODE = """
[[nodes]]
name = "{name}"
agent = "http://127.0.0.1:{port}"
token_env = "T_LINK"
"""


class MeteredTerminal(Terminal):
    """A tmux terminal that also hands over every byte the program writes to it."""

    def meter(self, path: Path) -> None:
        self._tmux("pipe-pane", "-O", "-t", "t", f"cat >> {path}")

    def styled(self) -> str:
        """The screen with its attributes, as tmux keeps them."""
        return self._tmux("capture-pane", "-e", "-p", "-t", "t")


@pytest.fixture
def small_fleet(agent_factory, tmp_path: Path):
    """Two real agents; the fleet file naming both."""
    ports = [free_port(), free_port()]
    text = FLEET.format(state=tmp_path / "state") + "".join(
        NODE.format(name=f"n{i}", port=port) for i, port in enumerate(ports)
    )
    agents = [agent_factory(text, node=f"n{i}", port=port) for i, port in enumerate(ports)]
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(text)
    return fleet, agents


def console(fleet: Path, *args: str, **env: str) -> MeteredTerminal:
    argv = [str(ROOT / ".venv" / "bin" / "python"), "-m", "console.cli", "--fleet", str(fleet)]
    return MeteredTerminal(
        [*argv, *args], SIZE, console_env(T_LINK=VIEWER, **env), ROOT
    )  # fmt: skip


def row_of(term: Terminal, node: str) -> str:
    return next((r for r in term.screen() if r.startswith(f" {node} ")), "")


@pytest.mark.parametrize("driver", ["the console's", "Textual's own"])
def test_an_idle_fleet_screen_writes_little_and_a_change_shows_within_a_refresh(
    small_fleet, tmp_path: Path, driver: str
):
    """Idle, the screen writes less than IDLE_BYTES_PER_REFRESH a refresh, with the
    console's driver and with Textual's own (nothing is repainted that did not change);
    Ctrl+L writes the whole screen again; a node going stale, then down, shows at the
    refresh after the collector says so."""
    fleet, agents = small_fleet
    env = {"TEXTUAL_DRIVER": TEXTUAL_DRIVER} if driver == "Textual's own" else {}
    written = tmp_path / "written.bin"
    written.touch()
    term = console(fleet, **env)
    with term:
        term.meter(written)
        term.wait_for("nodes 2 up", timeout=60)
        term.wait_for(lambda rows: "up" in row_of(term, "n1"), what="n1 up")
        time.sleep(2)  # the first frames have gone (a measure's window, not a wait)
        before = written.stat().st_size
        time.sleep(WINDOW_S)
        per_refresh = (written.stat().st_size - before) / WINDOW_S
        assert per_refresh < IDLE_BYTES_PER_REFRESH, (
            f"{per_refresh:.0f} bytes a refresh, idle ({driver} driver)"
        )
        # Ctrl+L writes the whole screen again (its 50 rows, each at least its position).
        written_before = written.stat().st_size
        term.keys("C-l")
        wait_until(lambda: written.stat().st_size - written_before > 50 * 200, 10, what="C-l")
        stop(agents[1].process, grace=5)
        gone = time.monotonic()  # its last snapshot was taken before this
        for status, after in (("stale", STALE_AFTER), ("down", DOWN_AFTER)):
            term.wait_for(f" n1           {status} ", timeout=30)
            # The collector calls it so `after` snapshot intervals (1 s) after the last;
            # the screen says so at the next refresh (1 s), on a shared machine.
            took = time.monotonic() - gone
            assert took < after + 1 + FRESH_SLACK_S, f"{status} showed {took:.1f} s after"


def redraws(term: Terminal, seconds: float) -> int:
    """How many times what the screen shows changed in `seconds`."""
    changes, last = 0, None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        shown = term.screen()
        if shown != last:
            changes += last is not None
            last = shown
        time.sleep(0.05)
    return changes


def on_node_screen(term: Terminal, slow_link: bool) -> None:
    """Open the Node screen of n0 and wait until its first frames have gone."""
    term.wait_for("nodes 2 up", timeout=60)
    term.type(":")
    term.wait_for("engine NODE/ID", what="the command line open")  # its hint
    term.type("node n0")
    term.wait_for(":node n0", what="the command typed")
    term.keys("Enter")
    term.wait_for("snapshot age", timeout=30)
    if slow_link:
        term.wait_for("slow link: redrawn every 5 s", timeout=10)
    time.sleep(2)  # the screen's first frames have gone (a window, not a wait)


def test_slow_link_redraws_every_5_s_with_no_animation(small_fleet):
    """--slow-link: the Node screen, whose host figures move with every snapshot (each
    second), is redrawn every 5 s (the header says so); without it, every second.

    The plain console starts while the slow-link one is counted (a start only takes CPU
    from that count, it cannot add redraws), and is counted alone once that one is gone."""
    fleet, _ = small_fleet
    counted = {}
    with console(fleet, "--slow-link") as slow, ThreadPoolExecutor(1) as pool:
        on_node_screen(slow, slow_link=True)
        counting = pool.submit(redraws, slow, 10.0)
        with console(fleet) as plain:
            on_node_screen(plain, slow_link=False)
            counted["--slow-link"] = counting.result()
            slow.close()
            counted[None] = redraws(plain, 10.0)
    assert counted["--slow-link"] <= 3, counted
    assert counted[None] >= 6, counted


def shown(stream: str, tmp_path: Path, size: tuple[int, int] = SIZE) -> str:
    """What a real terminal (tmux) of `size` shows once it has been sent `stream`:
    each row with its attributes. The terminal does no output processing, as Textual's
    does not (a line feed stays a line feed)."""
    path = tmp_path / f"stream-{time.monotonic_ns()}.bin"
    path.write_text(stream)
    done = path.with_suffix(".done")
    script = f"stty -opost; cat {path}; touch {done}; exec sleep 600"
    term = _Styled(["sh", "-c", script], size, console_env(), tmp_path)
    with term:
        wait_until(done.exists, timeout=30, what="the stream sent")
        return term.styled()


class _Styled(Terminal):
    def styled(self) -> str:
        return self._tmux("capture-pane", "-e", "-p", "-t", "t")


def diffed(pieces: list[str], size: tuple[int, int] = SIZE) -> str:
    diff = ScreenDiff()
    diff.resized(size)
    return "".join(diff.feed(piece) for piece in pieces)


KEY_QUIET_S = 0.5  # what a key changed is drawn (the idle screen changes once a second)
KEY_MOST_S = 2.5


def record_console(fleet: Path, keys: list[bytes]) -> list[tuple[str, int]]:
    """The real console with Textual's own driver in a pty of SIZE, `keys` pressed in
    turn, each once the last one's redraw has come and the console has been quiet for
    KEY_QUIET_S (KEY_MOST_S at most): what it wrote, in the pieces each read got (cut
    before the last escape, so that none ends inside a sequence), each with how many keys
    were pressed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the console, as over SSH
        os.chdir(ROOT)
        env = console_env(T_LINK=VIEWER, TEXTUAL_DRIVER=TEXTUAL_DRIVER, TERM="xterm-256color")
        env.update(COLUMNS=str(SIZE[0]), LINES=str(SIZE[1]))
        python = str(ROOT / ".venv" / "bin" / "python")
        os.execve(python, [python, "-m", "console.cli", "--fleet", str(fleet)], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
    pieces: list[tuple[str, int]] = []
    pending = b""
    pressed = 0

    def read(seconds: float) -> bool:
        nonlocal pending
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                data = pending + os.read(fd, 1 << 16)
                cut = data.rfind(b"\x1b")
                pieces.append((data[:cut].decode(), pressed))
                pending = data[cut:]
        return "nodes 2 up" in "".join(p for p, _ in pieces)

    def settle() -> None:
        """Read until the key's redraw has come, then nothing more for KEY_QUIET_S."""
        deadline = time.monotonic() + KEY_MOST_S
        pressed_at = len(pieces)
        while time.monotonic() < deadline:
            seen = len(pieces)
            read(KEY_QUIET_S)
            if len(pieces) == seen > pressed_at:
                return

    try:
        wait_until(lambda: read(0.5), timeout=60, what="the fleet drawn")
        for key in keys:
            os.write(fd, key)
            pressed += 1
            settle()
    finally:
        os.kill(pid, 15)
        os.waitpid(pid, 0)
        os.close(fd)
    return pieces


def test_the_terminal_shows_what_textual_drew(small_fleet, tmp_path: Path):
    """The real console on real agents, through every screen, a filter typed and a node
    opened: at each stop, the diffed stream draws the same screen as Textual's."""
    fleet, _ = small_fleet
    keys = [b"/", b"n1", b"\r", b"\x1b", b"g", b"m", b"v", b"j", b"n", b"\r", b"\x1b"]
    pieces = record_console(fleet, keys)
    for keys_pressed in (0, 3, 5, len(keys)):  # drawn; filtered; GPUs; back from a node
        upto = [p for p, pressed in pieces if pressed <= keys_pressed]
        raw = "".join(upto)
        assert shown(diffed(upto), tmp_path) == shown(raw, tmp_path), f"{keys_pressed} keys"
    everything = [p for p, _ in pieces]
    assert len(diffed(everything).encode()) < len("".join(everything).encode()) / 2


# Textual's frames, as its compositor writes them: a cursor position, then segments of
# SGR, text and a reset.
def frame(*rows: tuple[int, int, str]) -> str:
    return "".join(f"\x1b[{y};{x}H{text}" for y, x, text in rows) + "\x1b[1;1H"


CASES = {
    "wide characters over narrow ones and back": [
        frame((2, 1, "\x1b[1mgpu-東京-01\x1b[0m  up"), (3, 3, "abc")),
        frame((2, 1, "\x1b[1mgpu-tokyo-01\x1b[0m  up"), (3, 3, "東c")),
        frame((2, 5, "\x1b[32m京\x1b[0m"), (3, 4, "x")),
    ],
    "combining marks": [frame((4, 1, "cafe\u0301 ok")), frame((4, 1, "cafe\u0301 no"))],
    "links": [
        frame((5, 1, "\x1b]8;id=1;https://a.invalid\x1b\\\x1b[4mlink\x1b[0m\x1b]8;;\x1b\\ x")),
        frame((5, 1, "\x1b]8;id=1;https://a.invalid\x1b\\\x1b[4mlink\x1b[0m\x1b]8;;\x1b\\ y")),
    ],
    "an erase between frames": [
        frame((6, 1, "\x1b[41;37m hot \x1b[0m kept")),
        "\x1b[2J",
        frame((6, 1, "\x1b[41;37m hot \x1b[0m kept")),
    ],
    "the alternate screen, left and entered again": [
        frame((7, 1, "\x1b[38;5;208;48;5;17m 77\x1b[0m 80")),
        "\x1b[?1049l\x1b[?1049h",
        frame((7, 1, "\x1b[38;5;208;48;5;17m 77\x1b[0m 81")),
    ],
    "a line feed at the bottom scrolls": [
        frame((8, 1, "eight"), (10, 1, "ten")),
        "\x1b[10;1Hbottom\nafter",
        frame((8, 1, "eight"), (10, 1, "ten")),
    ],
    "writes off the screen, below it and past its right edge": [
        "\x1b[?7l" + frame((3, 1, "kept"), (10, 1, "last row")),  # no wrap, as Textual
        frame((12, 2, "below"), (3, 35, "0123456789")),
        frame((3, 1, "kept"), (4, 1, "more")),
    ],
    "attributes added to, and colours with 0 in them": [
        frame((9, 1, "\x1b[1m\x1b[38;5;0;48;5;15mbold black\x1b[0m plain")),
        frame((9, 1, "\x1b[1m\x1b[38;5;0;48;5;15mbold blank\x1b[0m plain")),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_textual_does_not_write_often_still_shows_right(case: str, tmp_path: Path):
    writes = CASES[case]
    size = (40, 10)
    assert shown(diffed(writes, size), tmp_path, size) == shown("".join(writes), tmp_path, size)


def test_a_changed_digit_is_all_that_is_written():
    """One digit changed in a row of a table: the cursor goes there, the attributes are
    set, the digit written, the attributes reset and the cursor put back where Textual
    left it; nothing else."""
    diff = ScreenDiff()
    diff.resized(SIZE)
    row = "\x1b[3;1H\x1b[38;5;253;48;5;235m gpu-a01  \x1b[0m\x1b[38;5;112;48;5;235m{}%\x1b[0m"
    diff.feed(row.format(68) + "\x1b[50;1H")
    assert diff.feed(row.format(68) + "\x1b[50;1H") == ""
    assert diff.feed(row.format(61) + "\x1b[50;1H") == (
        "\x1b[3;12H\x1b[0;38;5;112;48;5;235m1\x1b[0m\x1b[50;1H"
    )


def test_a_terminal_of_another_size_is_written_in_full():
    """After a resize nobody knows what the terminal shows: every cell is written."""
    diff = ScreenDiff()
    diff.resized(SIZE)
    line = "\x1b[2;1H\x1b[1mnodes 2 up\x1b[0m"
    diff.feed(line)
    assert diff.feed(line) == ""
    diff.resized((80, 24))
    assert "nodes 2 up" in diff.feed(line)


def test_what_is_kept_of_the_screen_is_the_screen_at_most():
    """Writes beyond the terminal's size go through as they came and keep nothing: what
    ScreenDiff holds is bounded by the terminal it writes to."""
    diff = ScreenDiff()
    diff.resized((40, 10))
    far = "\x1b[100000;1Hfar\x1b[3;39H" + "x" * 100_000
    assert diff.feed(far).endswith("x" * 100_000)  # written as it came
    assert all(y < 10 and len(row) <= 41 for y, row in diff._chars.items())
    assert diff.feed("\x1b[3;1Hkept") == "\x1b[3;1Hkept"
