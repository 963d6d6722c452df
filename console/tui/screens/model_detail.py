"""Model detail: TTFT and ITL p95 over time per deployment, where a picture reads faster."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static
from textual_plotext import PlotextPlot

from console.collect.prometheus.http import PromError
from console.collect.sources.source import HistoryLine
from console.collect.views.view import DeploymentRow
from console.core.config.load import Model
from console.core.safetext import for_terminal
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.polling import Poll
from console.tui.screens.base import ViewScreen
from console.tui.screens.models import slo_text
from console.tui.widgets.safe_static import SafeStatic

HISTORY_EVERY_S = 30.0  # range queries again: a new point every 15 s at the most


class ModelDetailScreen(ViewScreen):
    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.where = f"Model {model}"
        # From Prometheus' range queries: the last hour, from before the console started.
        self.history_lines: list[HistoryLine] | None = None
        self.history_error: str | None = None

    def on_mount(self) -> None:
        super().on_mount()
        if self.console.collector.history_source() is not None:
            Poll(self, HISTORY_EVERY_S, self._read_history, "model-history").now()

    async def _read_history(self) -> None:
        source = self.console.collector.history_source()
        if source is None:
            return
        try:
            self.history_lines = await source.model_history(self.model)
            self.history_error = None
        except PromError as exc:
            self.history_error = f"history from Prometheus: {exc}"
        if self.built is not None:
            self.draw(self.built)

    def compose_body(self) -> ComposeResult:
        yield SafeStatic(id="model-info")
        with Horizontal(id="plots"):
            yield PlotextPlot(id="ttft-plot")
            yield PlotextPlot(id="itl-plot")

    def draw(self, built: ViewBuilt) -> None:
        rows = built.view.models.get(self.model)
        info = self.query_one("#model-info", Static)
        if rows is None:
            info.update(Text(f"no model named {self.model!r} in this fleet", style="bold red"))
            return
        model = next(
            (m for m in self.console.fleet.models if m.name == self.model),
            Model.model_construct(name=self.model),  # served, not declared: an engine's name
        )
        t = Text.assemble(
            (self.model, "bold"),
            "  ",
            (slo_text(model.slo), "dim"),
            f"  {len(rows)} deployments; p95 per poll (mean where the engine has no histogram)",
        )
        if self.history_lines is not None:
            section = self.console.fleet.prometheus
            span = section.history_s / 60 if section else 0
            t = t.append(f"; the last {span:.0f} min from Prometheus", style="cyan")
        if self.history_error is not None:
            t = t.append(f"  {self.history_error}", style="bold red")
        info.update(t)
        history = built.history
        for series, plot_id, title, limit_ms in (
            ("ttft_p95", "#ttft-plot", "TTFT p95", model.slo.ttft_p95_ms),
            ("itl_p95", "#itl-plot", "ITL p95", model.slo.itl_p95_ms),
        ):
            widget = self.query_one(plot_id, PlotextPlot)
            plt = widget.plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(title)
            plt.xlabel("seconds ago")
            # Each line as (xs, ys in seconds, label), drawn once the axis' unit is known.
            lines: list[tuple[list[float], list[float], str]] = []
            if self.history_lines is not None:
                lines = self._history(rows, series.removesuffix("_p95"))
            for r in rows if self.history_lines is None else ():
                if r.engine_id is None or r.stats is None:
                    continue
                rings = history.deployment(r.node, r.engine_id, r.stats.name)
                if rings is None:
                    continue
                values = rings[series].values()
                step = self.console.refresh_s
                points = [
                    ((i - len(values) + 1) * step, v) for i, v in enumerate(values) if v is not None
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    # plotext's output is read as ANSI: a label must hold no sequence.
                    label = for_terminal(r.id or r.engine_id)[:18]
                    pct = getattr(r.stats.latency, series.replace("_p95", "_s"))
                    if pct.p95 is None and pct.mean is not None:
                        label += " (mean)"  # no histogram: a mean, never taken for a p95
                    lines.append((list(xs), list(ys), label))
            limit = None if limit_ms is None else limit_ms / 1000
            for line_xs, line_ys, line_label in lines:
                plt.plot(line_xs, line_ys, label=line_label)
            if lines:
                if limit is not None:
                    plt.hline(limit, "red")
                _latency_axis(plt, [y for _, line_ys, _ in lines for y in line_ys] + [limit or 0.0])
            else:
                plt.title(f"{title}: no data yet")
            widget.refresh()

    def _history(
        self, rows: list[DeploymentRow], figure: str
    ) -> list[tuple[list[float], list[float], str]]:
        """Each deployment's line from the range queries, x in seconds before now."""
        now = time.time()
        names = {(r.node, r.engine_id): r.id or r.engine_id or "?" for r in rows}
        out = []
        for line in self.history_lines or ():
            name = names.get((line.node, line.engine_id))
            if line.figure != figure or name is None or not line.points:
                continue
            out.append(
                (
                    [t - now for t, _ in line.points],
                    [v for _, v in line.points],
                    for_terminal(name)[:18],
                )
            )
        return out


def _latency_axis(plt: Any, values: list[float]) -> None:
    """The y axis in the units a latency reads in (42ms, 1.20s, 616s, 10m), never a raw
    number of milliseconds such as 616000.0."""
    top = max(values) if values else 0.0
    if top <= 0:
        return
    ticks = [top * i / 4 for i in range(5)]
    plt.yticks(ticks, [fmt.seconds(t) for t in ticks])
