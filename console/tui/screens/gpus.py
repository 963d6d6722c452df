"""GPUs: every GPU of the fleet as a row, to filter (`util>80`, `temp>85`) and sort by eye."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widgets import DataTable

from console.collect.view import FleetView
from console.tui import format as fmt
from console.tui.screens.base import ViewScreen
from console.tui.widgets.table import FleetTable, Row

COLUMNS = [
    ("NODE", 12),
    ("GPU", 4),
    ("UTIL", 5),
    ("MEM", 10),
    ("TEMP", 5),
    ("POWER", 10),
    ("ECC", 4),
    ("CLOCK EVENTS", 19),
    ("PROCESSES", None),
]


class GpusScreen(ViewScreen):
    where = "GPUs"

    def compose_body(self) -> ComposeResult:
        yield FleetTable(COLUMNS, id="gpus")

    def draw(self, view: FleetView) -> None:
        t = self.console.fleet.thresholds
        rows = []
        for cell in view.gpus:
            g = cell.gpu
            procs = ", ".join(f"{p.engine_id or p.name or p.pid}" for p in g.processes or [])
            reasons = ", ".join(r for r in g.clock_event_reasons or [] if r != "idle")
            power = Text.assemble(
                fmt.watts(g.power_w, g.power_limit_w), "/", fmt.watts(g.power_limit_w)
            )
            ecc = fmt.count(g.ecc_uncorrected)
            if g.ecc_uncorrected:
                ecc.stylize("bold red")
            mem_pct = (
                100 * g.memory_used_bytes / g.memory_total_bytes
                if g.memory_used_bytes is not None and g.memory_total_bytes
                else None
            )
            cells = (
                Text(cell.node, style="dim" if cell.node_status != "up" else ""),
                Text(str(g.index)),
                fmt.pct(g.utilization_pct),
                fmt.gib(g.memory_used_bytes, g.memory_total_bytes),
                fmt.temp(g.temperature_c, t.gpu_temp_warn_c, t.gpu_temp_crit_c),
                power,
                ecc,
                Text(reasons, style="yellow" if reasons else ""),
                Text(procs or "-", style="" if procs else "dim"),
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
                    cells,
                    fields,
                    f"{cell.node} gpu{g.index} {g.name} {procs} {reasons}",
                )
            )
        self.query_one(FleetTable).show(rows, self.filter)

    @on(DataTable.RowSelected, "#gpus")
    def _open_node(self, event: DataTable.RowSelected) -> None:
        self.console.open_node(str(event.row_key.value).split("/", 1)[0])
