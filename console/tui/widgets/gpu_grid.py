"""One cell per GPU, coloured by utilization, a row per node (as all-smi's LED grid).

A thousand nodes make eight thousand cells, so the grid draws only the lines on screen
(Textual's line API): each refresh stores the cells and where each node's first line
is, and render_line finds and builds the few visible lines. A refresh repaints only the
lines on screen whose cells show something else: repainting the whole grid sent every
line of it to the terminal again each second (issue 28).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import cast

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console.collect.views.view import GpuCell
from console.core.safetext import for_terminal

CELL = 4  # "100" and a marker
_STYLES = {
    "hot": Style(color="black", bgcolor="red", bold=True),
    "busy": Style(color="black", bgcolor="yellow"),
    "calm": Style(color="black", bgcolor="green"),
    "unknown": Style(dim=True, reverse=True),
    "stale": Style(dim=True, reverse=True),
}
_MARK = Style(color="red", bold=True)
_LABEL = Style(bold=True)


def _style(util: float | None, stale: bool) -> Style:
    if stale:
        return _STYLES["stale"]
    if util is None:
        return _STYLES["unknown"]
    return _STYLES["hot" if util >= 80 else "busy" if util >= 60 else "calm"]


class GpuGrid(ScrollView):
    DEFAULT_CSS = "GpuGrid { height: auto; max-height: 45%; padding: 0 1; }"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._by_node: list[tuple[str, list[GpuCell]]] = []
        self._starts: list[int] = []  # each node's first line
        self._lines = 0
        self._per_line = 1
        self._temp_crit = 90.0
        self._label_width = 8
        self._sized = -1  # the width the lines were laid out for
        self._painted: dict[int, tuple[object, ...]] = {}  # line on screen -> what it shows

    def show(
        self, by_node: list[tuple[str, list[GpuCell]]], temp_crit: float, same_nodes: bool = False
    ) -> None:
        """`by_node`: each node's cells, in the order the rows go (FleetView.gpus_by_node).
        `same_nodes`: the same nodes with as many GPUs each as last time (a patched view):
        where each node's line starts is kept, not worked out again for 10,000 nodes."""
        self._temp_crit = temp_crit
        if same_nodes and len(by_node) == len(self._by_node) and self._sized == self.size.width:
            self._by_node = by_node
            width = self.size.width
            for y in range(self.size.height):
                if self._painted.get(y) != self._shows(y):
                    self.refresh(Region(0, y, width, 1))
            return
        self._sized = self.size.width
        self._label_width = min(14, max((len(n) for n, _ in by_node), default=4) + 1)
        width = max(20, (self.size.width or 80) - 2)
        per_line = max(1, (width - self._label_width) // CELL)
        # Each node's first line; a node with no GPU takes no line.
        starts = list(accumulate((-(-len(cells) // per_line) for _, cells in by_node), initial=0))
        line = starts.pop()
        self._by_node, self._starts, self._lines, self._per_line = by_node, starts, line, per_line
        size = Size(width, max(1, line))
        if size != self.virtual_size:  # a new size means a layout pass; most refreshes don't
            self.virtual_size = size
        self.refresh()

    def _line(self, index: int) -> tuple[str, list[GpuCell]]:
        """The label (on a node's first line) and the cells of line `index`."""
        at = bisect_right(self._starts, index) - 1  # the last node starting at or before it
        node, cells = self._by_node[at]
        part = index - self._starts[at]
        first = part * self._per_line
        return (node if part == 0 else "", cells[first : first + self._per_line])

    def _shows(self, y: int) -> tuple[object, ...]:
        """What line `y` on screen shows: its label and each cell's text, style and mark."""
        index = y + self.scroll_offset.y
        if not self._lines and index == 0:
            return ("no GPUs reported",)
        if index >= self._lines:
            return ()
        label, cells = self._line(index)
        shown: list[object] = [index, label]
        for cell in cells:
            gpu = cell.gpu
            util = gpu.utilization_pct
            stale = cell.node_status != "up"
            hot = gpu.temperature_c is not None and gpu.temperature_c >= self._temp_crit
            broken = bool(gpu.ecc_uncorrected or gpu.xid_events or gpu.errors)
            # "!" beside a GPU that is too hot or reports ECC/XID/NVML errors
            mark = "!" if (hot or broken) and not stale else " "
            shown += (" ? " if util is None else f"{util:3.0f}", _style(util, stale), mark)
        return tuple(shown)

    def render_line(self, y: int) -> Strip:
        shown = self._painted[y] = self._shows(y)
        if len(shown) == 1:
            return Strip([Segment(str(shown[0]), Style(dim=True))])
        if not shown:
            return Strip.blank(self.size.width)
        label = for_terminal(str(shown[1]))[: self._label_width - 1]  # a node's name
        segments = [Segment(f"{label:<{self._label_width}}", _LABEL)]
        for i in range(2, len(shown), 3):
            text, style, mark = shown[i : i + 3]
            segments.append(Segment(str(text), cast(Style, style)))
            segments.append(Segment(str(mark), _MARK))
        return Strip(segments).crop(self.scroll_offset.x, self.scroll_offset.x + self.size.width)
