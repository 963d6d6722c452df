"""Fleet: every node in one table, and every GPU in the heat grid below it."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widgets import DataTable

from console.collect.views.view import NodeRow
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.screens.base import ViewScreen
from console.tui.widgets.gpu_grid import GpuGrid
from console.tui.widgets.table import FleetTable, Row
from console.tui.widgets.top_diagnosis import TopDiagnosis, fleet_key, point

COLUMNS = [
    ("NODE", 13),  # longer names end in an ellipsis
    ("STATUS", 10),  # "no token", "stale/ssh"; "no token/ssh" ends in one
    ("GPUS", 5),
    ("UTIL", 5),
    ("MAX", 5),
    ("MEM", 10),
    ("TEMP", 5),
    ("ALRT", 5),
    ("ENGINES", None),  # the room left; longer lists end in an ellipsis
]
WIDTH = dict(COLUMNS)


def node_cells(n: NodeRow, warn: float, crit: float, room: int = 1000) -> Row:
    """`room`: the ENGINES column's width at this terminal's (columns.Fitted)."""

    def cells() -> tuple[Text, ...]:
        status = fmt.cut(fmt.status(n.status, "/ssh" if n.transport == "ssh" else ""), 10)
        detail = fmt.fit(n.engines or "-", room)
        if n.status == "no token":
            detail = fmt.fit(f"no token ({n.error})", room, "yellow")
        elif n.status != "up" and n.error:
            detail = fmt.fit(n.error, room, "red")
        elif n.gpu_status and n.gpu_status != "ok" and not n.gpus:
            detail = fmt.fit(f"{n.engines or '-'}  ({n.gpu_status})", room, "dim")
        alerts = (
            Text(fmt.number(n.alerts), style="bold red") if n.alerts else Text("0", style="dim")
        )
        return (
            fmt.fit(n.name, WIDTH["NODE"] or 0, "bold"),
            status,
            fmt.count(n.gpus),
            fmt.pct(n.util_avg),
            fmt.pct(n.util_max),
            fmt.gib(n.mem_used, n.mem_total),
            fmt.temp(n.temp_max, warn, crit),
            alerts,
            detail,
        )

    fields = {
        "node": n.name,
        "name": n.name,
        "status": n.status,
        "gpus": n.gpus,
        "util": n.util_avg,
        "util_max": n.util_max,
        "temp": n.temp_max,
        "alerts": n.alerts,
        "engine": n.engines,
        "transport": n.transport,
    }
    return Row(n.name, cells, fields, f"{n.name} {n.status} {n.engines} {n.error or ''}")


class FleetScreen(ViewScreen):
    where = "Fleet"
    drawn_nodes = 0  # nodes shown up at the last draw

    def __init__(self) -> None:
        super().__init__()
        # Each node's table row, by its view row's identity: a view keeps the row of a
        # node that did not change, so a draw makes rows only for those that did (a
        # tenth of 10,000 nodes a refresh, read from Prometheus in slices).
        self._made: dict[int, tuple[NodeRow, Row]] = {}
        # The last draw unfiltered: the view's number, its lines and the rows made of them.
        # The next patches the nodes that changed since (Changes.since).
        self._drawn: tuple[int, list[NodeRow], list[Row]] | None = None
        self._room = 0  # the ENGINES column's width the rows were made for

    def compose_body(self) -> ComposeResult:
        self.fitted = Fitted(self, COLUMNS, "nodes", self._redraw)
        yield TopDiagnosis()
        yield from self.fitted.compose()
        yield GpuGrid(id="grid")

    def _redraw(self) -> None:
        self.redraw()

    def draw(self, built: ViewBuilt) -> None:
        if not self.fitted.ready():
            return
        view, found = built.view, built.findings
        point(self.query_one(TopDiagnosis), self.query_one(FleetTable), found.found,
              found.counts[0] if found.counts else 0, fleet_key)  # fmt: skip
        room = self.fitted.fit.room
        if room != self._room:  # the rows made so far are cut to the old width
            self._made, self._drawn, self._room = {}, None, room
        t = self.console.fleet.thresholds
        table = self.query_one(FleetTable)
        changed = None
        if self.filter is None and self._drawn is not None:
            changed = built.changes.since(self._drawn[0])
        if changed is not None and self._drawn is not None:
            _, lines, rows = self._drawn
            rows = rows.copy()
            for name in changed:
                i = view.at[name]
                n = view.nodes[i]
                if lines[i] is not n:
                    rows[i] = node_cells(n, t.gpu_temp_warn_c, t.gpu_temp_crit_c, room)
            self._drawn = (view.serial, view.nodes, rows)
            table.show(rows, same_keys=True)
            self.drawn_nodes = view.summary.nodes_up
            self.query_one(GpuGrid).show(view.gpus_by_node, t.gpu_temp_crit_c, same_nodes=True)
            return
        made, kept = {}, self._made
        rows, up = [], 0
        for n in view.nodes:
            old = kept.get(id(n))
            row = (
                old[1]
                if old is not None and old[0] is n
                else node_cells(n, t.gpu_temp_warn_c, t.gpu_temp_crit_c, room)
            )
            made[id(n)] = (n, row)
            rows.append(row)
            up += n.status == "up"
        self._made = made
        table.show(rows, self.filter)
        self._drawn = (view.serial, view.nodes, rows) if self.filter is None else None
        self.drawn_nodes = up
        by_node = view.gpus_by_node
        if self.filter is not None:
            shown = set(table.rows_by_key)
            by_node = [(node, cells) for node, cells in by_node if node in shown]
        self.query_one(GpuGrid).show(by_node, t.gpu_temp_crit_c)

    @on(DataTable.RowSelected, "#nodes")
    def _open_node(self, event: DataTable.RowSelected) -> None:
        self.console.open_node(str(event.row_key.value))
