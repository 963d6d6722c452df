"""Model detail: TTFT and ITL p95 over time per deployment, where a picture reads faster."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static
from textual_plotext import PlotextPlot

from console.collect.view import FleetView
from console.core.config import Model
from console.tui.screens.base import ViewScreen
from console.tui.screens.models import slo_text


class ModelDetailScreen(ViewScreen):
    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.where = f"Model {model}"

    def compose_body(self) -> ComposeResult:
        yield Static(id="model-info")
        with Horizontal(id="plots"):
            yield PlotextPlot(id="ttft-plot")
            yield PlotextPlot(id="itl-plot")

    def draw(self, view: FleetView) -> None:
        rows = view.models.get(self.model)
        info = self.query_one("#model-info", Static)
        if rows is None:
            info.update(Text(f"no model named {self.model!r} in this fleet", style="bold red"))
            return
        model = next(
            (m for m in self.console.fleet.models if m.name == self.model), Model(name=self.model)
        )
        t = Text.assemble(
            (self.model, "bold"),
            "  ",
            (slo_text(model.slo), "dim"),
            f"  {len(rows)} deployments; p95 per poll (mean where the engine has no histogram)",
        )
        info.update(t)
        history = self.console.collector.history
        for series, plot_id, title, limit in (
            ("ttft_p95", "#ttft-plot", "TTFT p95 (ms)", model.slo.ttft_p95_ms),
            ("itl_p95", "#itl-plot", "ITL p95 (ms)", model.slo.itl_p95_ms),
        ):
            widget = self.query_one(plot_id, PlotextPlot)
            plt = widget.plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(title)
            plt.xlabel("seconds ago")
            longest = 0
            for r in rows:
                if r.engine_id is None or r.stats is None:
                    continue
                rings = history.deployment(r.node, r.engine_id, r.stats.name)
                if rings is None:
                    continue
                values = rings[series].values()
                longest = max(longest, len(values))
                step = self.console.refresh_s
                points = [
                    ((i - len(values) + 1) * step, v * 1000)
                    for i, v in enumerate(values)
                    if v is not None
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    plt.plot(list(xs), list(ys), label=(r.id or r.engine_id)[:18])
            if limit is not None and longest:
                plt.hline(limit, "red")
            if longest == 0:
                plt.title(f"{title}: no data yet")
            widget.refresh()
