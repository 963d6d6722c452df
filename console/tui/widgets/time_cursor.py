"""The replay's time cursor: where in the recording the console is, how fast it moves,
and where the alerts and operator actions are on the way."""

from __future__ import annotations

import datetime as dt

from rich.text import Text
from textual.widgets import Static

from console.collect.recordings.replay import ReplayCollector
from console.tui.format import safe


def clock(t: float) -> str:
    """A replayed moment as the postmortem writes it: UTC, to the second."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def span(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class TimeCursor(Static):
    DEFAULT_CSS = """
    TimeCursor { height: 2; background: $panel; }
    """

    def show(self, replay: ReplayCollector, playing: bool, speed: float) -> None:
        start, end, at = replay.first, replay.last, replay.at
        width = max(10, (self.size.width or 80) - 2)
        bar = ["─"] * width
        length = max(end - start, 1e-9)
        styles: dict[int, str] = {}
        for mark in replay.marks():
            if not start <= mark.time <= end:
                continue  # an audited action older than the recording: no place on the bar
            i = min(width - 1, int((mark.time - start) / length * width))
            bar[i] = "│"
            styles[i] = (
                "bold red"
                if mark.kind in ("raised", "active")
                else ("green" if mark.kind == "cleared" else "bold cyan")
            )
        here = min(width - 1, int((at - start) / length * width))
        bar[here] = "●"
        styles[here] = "bold yellow"
        t = Text(" ")
        for i, ch in enumerate(bar):
            t.append(ch, style=styles.get(i, "dim"))
        t.append("\n ")
        t.append("▶ playing" if playing else "❚❚ paused", style="bold")
        t.append(f" {speed:g}×  ")
        t.append(clock(at), style="bold yellow")
        t.append(f"  +{span(at - start)} of {span(end - start)}")
        ahead = replay.next_mark()
        if ahead is not None:
            t.append(f"  next {ahead.kind} +{span(ahead.time - at)}: ", style="dim")
            t.append(f"{ahead.subject} {ahead.message}"[:60], style="dim")
        self.update(safe(t, lines=True))  # the next mark's subject: the recording's text
