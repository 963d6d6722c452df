"""GPUs: every GPU of the fleet as a row, to filter (`util>80`, `temp>85`) and sort by eye."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widgets import DataTable

from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.screens.base import ViewScreen
from console.tui.widgets.table import FleetTable, Row

COLUMNS = [
    ("NODE", 11),  # longer names end in an ellipsis
    ("GPU", 4),
    ("UTIL", 5),
    ("MEM", 10),
    ("TEMP", 5),
    ("POWER", 11),  # "1000/1200W"
    ("ECC", 5),  # "9999"
    ("CLOCK EVENTS", 19),  # "software thermal slowdown" ends in an ellipsis
    ("PROCESSES", None),  # the room left, at least columns.MIN_ROOM
]
WIDTH = dict(COLUMNS)
# NVML's clock-event reasons (console/core/metrics/readings.py) as the column can hold them.
SHORT = {
    "applications clocks setting": "app clocks",
    "software power cap": "sw power cap",
    "hardware slowdown": "hw slowdown",
    "software thermal slowdown": "sw thermal",
    "hardware thermal slowdown": "hw thermal",
    "hardware power brake": "hw power brake",
    "display clock setting": "display clock",
}
SPARE = (5, 3)  # at 80 columns POWER goes first, then MEM: heat and throttling stay


class GpusScreen(ViewScreen):
    where = "GPUs"

    def compose_body(self) -> ComposeResult:
        self.fitted = Fitted(self, COLUMNS, "gpus", self._redraw, SPARE)
        yield from self.fitted.compose()

    def _redraw(self) -> None:
        self.redraw()

    def draw(self, built: ViewBuilt) -> None:
        if not self.fitted.ready():
            return
        view = built.view
        fit = self.fitted.fit
        t = self.console.fleet.thresholds
        rows = []
        for cell in view.gpus:
            g = cell.gpu
            procs = ", ".join(f"{p.engine_id or p.name or p.pid}" for p in g.processes or [])
            reasons = ", ".join(SHORT.get(r, r) for r in g.clock_event_reasons or [] if r != "idle")
            ecc = fmt.count(g.ecc_uncorrected)
            if g.ecc_uncorrected:
                ecc.stylize("bold red")
            mem_pct = (
                100 * g.memory_used_bytes / g.memory_total_bytes
                if g.memory_used_bytes is not None and g.memory_total_bytes
                else None
            )
            cells = (
                fmt.fit(cell.node, WIDTH["NODE"] or 0, "dim" if cell.node_status != "up" else ""),
                Text(str(g.index)),
                fmt.pct(g.utilization_pct),
                fmt.gib(g.memory_used_bytes, g.memory_total_bytes),
                fmt.temp(g.temperature_c, t.gpu_temp_warn_c, t.gpu_temp_crit_c),
                fmt.power(g.power_w, g.power_limit_w),
                ecc,
                fmt.fit(reasons, WIDTH["CLOCK EVENTS"] or 0, "yellow" if reasons else ""),
                fmt.fit(procs or "-", fit.room, "" if procs else "dim"),
            )
            fields = {
                "node": cell.node,
                "gpu": g.index,
                "util": g.utilization_pct,
                "mem": mem_pct,
                "temp": g.temperature_c,
                "power": g.power_w,
                "ecc": g.ecc_uncorrected,
                "name": g.name,
            }
            rows.append(
                Row(
                    f"{cell.node}/{g.index}",
                    fit.pick(cells),
                    fields,
                    f"{cell.node} gpu{g.index} {g.name} {procs} {reasons}",
                )
            )
        self.query_one(FleetTable).show(rows, self.filter)

    @on(DataTable.RowSelected, "#gpus")
    def _open_node(self, event: DataTable.RowSelected) -> None:
        self.console.open_node(str(event.row_key.value).split("/", 1)[0])
