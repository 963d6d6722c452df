"""One cell per GPU, coloured by utilization, a row per node (as all-smi's LED grid)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from console.collect.view import GpuCell
from console.tui.format import util_style


def render_grid(cells: list[GpuCell], temp_crit: float, width: int = 80) -> Text:
    by_node: dict[str, list[GpuCell]] = {}
    for cell in cells:
        by_node.setdefault(cell.node, []).append(cell)
    name_width = min(14, max((len(n) for n in by_node), default=4) + 1)
    per_line = max(1, (width - name_width - 2) // 4)
    out = Text()
    for node, node_cells in by_node.items():
        for start in range(0, len(node_cells), per_line):
            label = node if start == 0 else ""
            out.append(f"{label[: name_width - 1]:<{name_width}}", style="bold" if label else "")
            for cell in node_cells[start : start + per_line]:
                u = cell.gpu.utilization_pct
                stale = cell.node_status != "up"
                text = " ? " if u is None else f"{u:3.0f}"
                style = "dim reverse" if stale else f"reverse {util_style(u)}"
                hot = cell.gpu.temperature_c is not None and cell.gpu.temperature_c >= temp_crit
                broken = bool(cell.gpu.ecc_uncorrected or cell.gpu.xid_events or cell.gpu.errors)
                out.append(text, style=style)
                # "!" beside a GPU that is too hot or reports ECC/XID/NVML errors
                out.append("!" if (hot or broken) and not stale else " ", style="bold red")
            out.append("\n")
    if not by_node:
        out.append("no GPUs reported", style="dim")
    return out


class GpuGrid(Static):
    DEFAULT_CSS = "GpuGrid { height: auto; padding: 0 1; }"

    def show(self, cells: list[GpuCell], temp_crit: float) -> None:
        self.update(render_grid(cells, temp_crit, max(40, self.size.width or 80)))
