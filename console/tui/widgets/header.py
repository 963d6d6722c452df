"""The line at the top of every screen: which fleet, which environment, how it is."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from console.collect.views.view import Summary
from console.tui.format import safe


class FleetHeader(Static):
    DEFAULT_CSS = """
    FleetHeader { height: 1; background: $panel; }
    FleetHeader.prod { background: $error; color: $text; }
    """

    _shown: tuple[object, ...] = ()  # what the line shows: its text, styles and class

    def show(
        self,
        s: Summary,
        where: str,
        read_only: bool,
        simulated: bool,
        replay: str | None = None,
        source_problem: str | None = None,
        source_note: str | None = None,
        redraw_s: float | None = None,
        diagnoses: tuple[int, int] | None = None,
    ) -> None:
        """`replay`: the replayed time, shown with REPLAY where the environment goes, so
        nobody takes a recording for the fleet. `source_problem`: why the figures may be
        old (Prometheus slow, down or erring), said before anything else on the line;
        `source_note`: what a healthy Prometheus source costs, said last; `redraw_s`: how
        often a --slow-link console redraws, so nobody takes a number for this second's;
        `diagnoses`: (open, critical), the count said beside the alerts when there are any,
        red when one is critical (a part of the fleet unseen is said above; None: not
        looked yet)."""
        self.set_class(s.environment.lower() == "prod" and replay is None, "prod")
        t = Text()
        t.append(f" {s.name} ", style="bold black on yellow" if simulated else "bold reverse")
        if replay is not None:
            t.append(" REPLAY ", style="bold white on magenta")
            t.append(f" {replay} ", style="bold magenta")
        else:
            env_style = "bold white on red" if s.environment.lower() == "prod" else "bold"
            t.append(f" {s.environment.upper()} ", style=env_style)
        if source_problem is not None:
            t.append(f" {source_problem} ", style="bold white on red")
        if s.unseen:  # a view blind to part of the fleet says so before anything else
            style = "bold white on red" if s.nodes_up == 0 else "bold black on yellow"
            t.append(f" cannot see {s.unseen} of {s.nodes} nodes ", style=style)
        if simulated and "SIMULATED" not in s.name.upper():
            t.append(" SIMULATED ", style="bold black on yellow")
        if read_only and replay is None:
            t.append(" READ-ONLY ", style="bold black on cyan")
        t.append(f"  nodes {s.nodes_up} up", style="green" if s.nodes_up else "")
        if s.nodes_stale:
            t.append(f" {s.nodes_stale} stale", style="bold yellow")
        if s.nodes_down:
            t.append(f" {s.nodes_down} down", style="bold red")
        if s.nodes_no_token:
            t.append(f" {s.nodes_no_token} no token", style="yellow")
        if s.nodes_waiting:
            t.append(f" {s.nodes_waiting} waiting", style="dim")
        util = "?" if s.util_avg is None else f"{s.util_avg:.0f}%"
        t.append(f"  {s.gpus} GPUs {util}")
        if diagnoses is not None and diagnoses[0]:
            # Before the alerts and short: the line is full at 80 columns (100 in a
            # replay), and both counts must show there. Red when one is critical.
            n, crit = diagnoses
            t.append(" ")  # the block's own padding makes it two
            t.append(f" diag {n} ", style="bold white on red" if crit else "bold black on yellow")
        if s.alerts:
            style = "bold red" if s.critical else "bold yellow"
            t.append(
                f"  alerts {s.alerts}" + (f" ({s.critical} crit)" if s.critical else ""),
                style=style,
            )
        elif s.unseen:
            t.append(f"  alerts ? ({s.unseen} unseen)", style="bold yellow")
        else:
            t.append("  no alerts", style="green")
        t.append(f"  {where}", style="bold cyan")
        if source_note is not None:
            t.append(f"  {source_note}", style="dim")
        if redraw_s is not None:
            t.append(f"  slow link: redrawn every {redraw_s:g} s", style="dim")
        # One line, always: no layout pass each refresh. Names and Prometheus' errors are
        # outside text. The same line is not repainted: an idle fleet's header is.
        shown = safe(t)
        key = (shown.plain, shown.spans, self.has_class("prod"))
        if key != self._shown:
            self._shown = key
            self.update(shown, layout=False)
