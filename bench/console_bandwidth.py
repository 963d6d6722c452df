"""What the console writes to its terminal, per screen, at 10, 100 and 1,000 nodes.

    .venv/bin/python -m bench.console_bandwidth [10 100 1000] [--window S]
        [--before DIR] [--out FILE]        (make bench: --out docs/evidence/bench-bandwidth.txt)

The console is the real one (`python -m console.cli --fleet F`, a process of its own) in
a pseudo-terminal of 200x50 with TERM=xterm-256color, on the SIMULATED scale fleet
(`console.sim --scale N`, whose values move every second: each GPU's utilization and
temperature, each node's averages). Nobody presses a key during a window. For each screen
(Fleet, GPUs, Models, Events, Jobs, a Node): the key that opens it, SETTLE_S for its first
frames to go, then the bytes written in each refresh (1 s) of a `--window` (default 10 s).
Reported: the median of those per refresh, as kbit/s, and the console's CPU over the
window. Then Fleet again with --slow-link, per 5 s redraw over three times the window.

The yardstick is `top -d 1` in the same pseudo-terminal size, measured in the same run
(issue 28: "top writes 63 kbit/s"); each figure is also given as a ratio to it.
`--before DIR` runs the console of another checkout (a git worktree of an earlier commit)
right before this one's on each fleet, for a comparison on the same machine, same minute.
Issue 28's target: at most 60 kbit/s idle on Fleet at 1,000 nodes, a 1 s refresh.
"""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import platform
import pty
import secrets
import select
import statistics
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.console_scale import start_scale_fleet  # noqa: E402
from console.sim.fleetfile import TOKEN_ENV  # noqa: E402
from console.tui.app import SLOW_LINK_REDRAW_S  # noqa: E402
from console.tui.terminal.screendiff import ScreenDiff  # noqa: E402

SIZE = (200, 50)
WINDOW_S = 10.0
SETTLE_S = 4.0  # after a key: the screen's first frames, not what it costs idle
START_S = 120.0  # the longest a console may take to show every node
NODE = "gpu-a01"  # the scale fleet's first node
# (screen, keys that open it from the one before, what the header then ends with)
SCREENS: list[tuple[str, bytes, str]] = [
    ("Fleet", b"", "Fleet"),
    ("GPUs", b"g", "GPUs"),
    ("Models", b"m", "Models"),
    ("Events", b"v", "Events"),
    ("Jobs", b"j", "Jobs"),
    ("Node", f":node {NODE}\r".encode(), f"Node {NODE}"),
]


class Terminal:
    """A program in a pseudo-terminal of SIZE; what it writes is read and timed, and kept
    as a screen (ScreenDiff reads a terminal's stream) to know what it shows."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        columns, rows = SIZE
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = {**env, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(rows)}
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        os.close(slave)
        self.screen = ScreenDiff()
        self.screen.resized(SIZE)
        self._pending = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self, seconds: float) -> list[tuple[float, int]]:
        """Read for `seconds`; (when, bytes) of each read."""
        got: list[tuple[float, int]] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], min(left, 0.1))
            if not ready:
                continue
            try:
                data = os.read(self.master, 1 << 16)
            except OSError:
                break
            got.append((time.monotonic(), len(data)))
            self._follow(data)
        return got

    def _follow(self, data: bytes) -> None:
        # Whole sequences only: a read may end inside one (or inside a character).
        text = self._pending + self._decoder.decode(data)
        cut = text.rfind("\x1b")
        cut = len(text) if cut < 0 else cut
        self._pending = text[cut:]
        self.screen.feed(text[:cut])

    def header(self) -> str:
        return self.screen.row(0)

    def wait_header(self, ends: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while f"  {ends}  " not in self.header() + "  ":
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the header never read {ends!r}: {self.header().strip()!r}")
            self.read(0.2)

    def keys(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self.master)


@dataclass
class Window:
    """Bytes per refresh (bins of `bin_s`) over a window, and the CPU it took."""

    bin_s: float
    bins: list[int] = field(default_factory=list)
    cpu_pct: float | None = None

    @property
    def median_kbit_s(self) -> float:
        return statistics.median(self.bins) * 8 / 1000 / self.bin_s

    @property
    def mean_kbit_s(self) -> float:
        return sum(self.bins) * 8 / 1000 / (self.bin_s * len(self.bins))


def measure(term: Terminal, window_s: float, bin_s: float) -> Window:
    process = psutil.Process(term.process.pid)
    cpu0, t0 = process.cpu_times(), time.monotonic()
    reads = term.read(window_s)
    cpu1, t1 = process.cpu_times(), time.monotonic()
    bins = [0] * max(1, round(window_s / bin_s))
    for when, size in reads:
        bins[min(len(bins) - 1, int((when - t0) / bin_s))] += size
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return Window(bin_s, bins, round(100 * cpu / (t1 - t0), 1))


def console_argv(fleet: Path, slow_link: bool) -> list[str]:
    return [
        sys.executable, "-m", "console.cli", "--fleet", str(fleet),
        *(["--slow-link"] if slow_link else []),
    ]  # fmt: skip


def run_console(
    fleet: Path, nodes: int, root: Path, window_s: float, token: str
) -> dict[str, Window]:
    """Each screen in turn, idle; then Fleet with --slow-link (a checkout that has it)."""
    env = {**os.environ, TOKEN_ENV: token}
    out: dict[str, Window] = {}
    term = Terminal(console_argv(fleet, False), env, root)
    try:
        _wait_all_up(term, nodes)
        for name, keys, ends in SCREENS:
            if keys:
                term.keys(keys)
            term.wait_header(ends, 30)
            term.read(SETTLE_S)
            out[name] = measure(term, window_s, 1.0)
    finally:
        term.close()
    if "SLOW_LINK_REDRAW_S" not in (root / "console" / "tui" / "app.py").read_text():
        return out
    term = Terminal(console_argv(fleet, True), env, root)
    try:
        _wait_all_up(term, nodes)
        term.read(SETTLE_S)
        out["Fleet --slow-link"] = measure(term, 3 * window_s, SLOW_LINK_REDRAW_S)
    finally:
        term.close()
    return out


def _wait_all_up(term: Terminal, nodes: int) -> None:
    deadline = time.monotonic() + START_S
    while f" nodes {nodes} up " not in term.header() + " ":
        if time.monotonic() > deadline or term.process.poll() is not None:
            shown = "\n".join(term.screen.row(y).rstrip() for y in range(SIZE[1]))
            raise RuntimeError(
                f"not every node up within {START_S:g} s (console exit code "
                f"{term.process.poll()}); the screen:\n{shown}"
            )
        term.read(0.2)


def run_top(window_s: float) -> Window:
    term = Terminal(["top", "-d", "1"], dict(os.environ), ROOT)
    try:
        term.read(SETTLE_S)
        return measure(term, window_s, 1.0)
    finally:
        term.close()


def commit_of(root: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "console")
    return head + (" with uncommitted changes in console/" if dirty else "")


def machine() -> str:
    model = "?"
    with open("/proc/cpuinfo") as cpuinfo:  # Linux only, as the bench
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{model}, {os.cpu_count()} CPUs, {memory:.0f} GiB, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def main(argv: list[str]) -> int:
    window_s = WINDOW_S
    before: Path | None = None
    out_file: Path | None = None
    sizes: list[int] = []
    args = iter(argv)
    for arg in args:
        if arg == "--window":
            window_s = float(next(args))
        elif arg == "--before":
            before = Path(next(args)).resolve()
        elif arg == "--out":
            out_file = Path(next(args))
        elif arg.isdigit():
            sizes.append(int(arg))
        else:
            print(f"bench.console_bandwidth: unknown argument {arg!r}", file=sys.stderr)
            return 2
    sizes = sizes or [10, 100, 1000]
    started = datetime.now(UTC)
    token = secrets.token_urlsafe(24)
    os.environ[TOKEN_ENV] = token
    codes = [("before", before), ("after", ROOT)] if before is not None else [("now", ROOT)]
    top = run_top(window_s)
    results: list[dict[str, object]] = []
    for nodes in sizes:
        sim, fleet = start_scale_fleet(nodes, token)
        try:
            time.sleep(1.5)  # the simulated agents have built their first snapshots
            for label, root in codes:
                for screen, w in run_console(fleet, nodes, root, window_s, token).items():
                    results.append(_row(nodes, label, screen, w, top))
                    print(json.dumps(results[-1]), flush=True)
        finally:
            sim.terminate()
            sim.wait(timeout=20)
    report = _report(results, top, codes, window_s, started)
    print(report)
    if out_file is not None:  # newest first; the runs before it kept below
        kept = out_file.read_text() if out_file.exists() else ""
        out_file.write_text(report + (f"\n# ---- the run before it ----\n{kept}" if kept else ""))
    return 0


def _row(nodes: int, code: str, screen: str, w: Window, top: Window) -> dict[str, object]:
    return {
        "nodes": nodes,
        "code": code,
        "screen": screen,
        "kbit_s_median": round(w.median_kbit_s, 1),
        "kbit_s_mean": round(w.mean_kbit_s, 1),
        "vs_top": round(w.median_kbit_s / top.median_kbit_s, 2) if top.median_kbit_s else None,
        "bytes_per_refresh": w.bins,
        "console_cpu_pct": w.cpu_pct,
        "load1": round(os.getloadavg()[0], 2),
    }


def _report(
    results: list[dict[str, object]],
    top: Window,
    codes: list[tuple[str, Path]],
    window_s: float,
    started: datetime,
) -> str:
    lines = [
        f"# .venv/bin/python -m bench.console_bandwidth   ({started:%Y-%m-%d %H:%M} UTC)",
        f"# machine: {machine()}",
        *(f"# {label}: {commit_of(root)} ({root})" for label, root in codes),
        f"# a pty of {SIZE[0]}x{SIZE[1]}, TERM=xterm-256color; the SIMULATED scale fleet, every "
        f"value moving each second; windows of {window_s:g} s after {SETTLE_S:g} s settling;",
        "# kbit/s: the median of the bytes written per refresh (1 s; --slow-link: per "
        f"{SLOW_LINK_REDRAW_S:g} s redraw), and the mean",
        f"# top -d 1, same size, same run: {top.median_kbit_s:.1f} kbit/s median, "
        f"{top.mean_kbit_s:.1f} mean (bytes per second {top.bins})",
        "",
        *(json.dumps(r) for r in results),
        "",
        "nodes code    screen              kbit/s median  mean  x top  console CPU %  load1",
    ]
    for r in results:
        lines.append(
            f"{r['nodes']:>5} {r['code']:<7} {r['screen']:<19} {r['kbit_s_median']:>13}"
            f" {r['kbit_s_mean']:>5}  {r['vs_top']!s:>5}  {r['console_cpu_pct']!s:>13}"
            f"  {r['load1']:>5}"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
