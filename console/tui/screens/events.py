"""Events: alerts raised and cleared, and operator actions, newest first.

The actions are the agents' jobs (start, stop, restart, drill) as the snapshots carry
them and the gateway's audit (failovers, weight changes), each with who and why; they
read as in a recording's replay (console/collect/views/operator_actions.py).
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult

from console.collect.clients.gateway_client import GatewayClient
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.screens.base import ViewScreen
from console.tui.widgets.table import FleetTable, Row

COLUMNS = [("TIME", 9), ("WHAT", 8), ("SUBJECT", 27), ("MESSAGE", None)]
STYLE = {"raised": "bold red", "active": "yellow", "cleared": "green", "action": "cyan"}


class EventsScreen(ViewScreen):
    where = "Events"

    def compose_body(self) -> ComposeResult:
        self.fitted = Fitted(self, COLUMNS, "events", self._redraw)
        yield from self.fitted.compose()

    def _redraw(self) -> None:
        self.redraw()

    def draw(self, built: ViewBuilt) -> None:
        if not self.fitted.ready():
            return
        room = self.fitted.fit.room  # MESSAGE: the width left, its text cut to it
        rows = []
        console = self.console
        if not console.offline and GatewayClient.configured(console.fleet):
            blind = built.gateway_blind
            if blind:  # the gateway's actions are unknown, not none
                why = fmt.fit(f"the gateway's actions are unknown: {blind}", room, "yellow")
                rows.append(Row("gateway", (Text(""), Text("?"), Text("gateway"), why)))
        events = built.events
        for i, e in enumerate(events):
            what = (
                ("CRIT" if e.severity == "critical" else "WARN")
                if e.kind == "raised"
                else "at start"
                if e.kind == "active"
                else e.kind
            )  # "at start": already raised when the recording began
            cells = (
                Text(time.strftime("%H:%M:%S", time.localtime(e.time))),
                Text(what, style=STYLE.get(e.kind, "")),
                fmt.fit(e.subject, 27),
                fmt.fit(e.message, room),
            )
            rows.append(
                Row(
                    f"{len(events) - i}",
                    cells,
                    {"kind": e.kind, "severity": e.severity, "subject": e.subject},
                    f"{e.kind} {e.subject} {e.message}",
                )
            )
        self.query_one(FleetTable).show(rows, self.filter)
