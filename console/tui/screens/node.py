"""Node: its GPUs with history, what runs on them, the host, and versions side by side."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from console.collect.views.history import History, Series
from console.collect.views.view import engine_summary
from console.core.snapshot import Snapshot
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.screens.base import ViewScreen
from console.tui.screens.drills import BADGE_STYLE, stale_badge
from console.tui.widgets.safe_static import SafeStatic
from console.tui.widgets.table import FleetTable, Row, empty_row

GPU_COLUMNS = [
    ("GPU", 4),
    ("UTIL", 5),
    ("util history", 17),
    ("MEM", 10),
    ("mem", 9),
    ("TEMP", 5),
    ("temp", 9),
    ("POWER", 6),
    ("power", 9),
    ("RUNS", None),  # the room left; a longer list ends in an ellipsis
]
GPU_SPARE = (2, 8, 6, 4)  # at 80 columns the histories go first, util's widest
ENGINE_COLUMNS = [
    ("ENGINE", 14),
    ("KIND", 8),
    ("VERSION", 11),
    ("STATE", 10),
    ("MODELS", 26),  # "mistral-7b-instruct-v0.3"; longer lists end in an ellipsis
    ("REASON", None),
]
ENGINE_SPARE = (1,)  # KIND: the engine's id names it too
STANDBY_REASON = "not started: a standby (weight 0)"


ACTIONS = ("start_vllm", "stop_engine", "restart_engine")


class NodeScreen(ViewScreen):
    BINDINGS = [
        Binding("s", "start_vllm", "start vLLM", id="start_vllm"),
        Binding("x", "stop_engine", "stop engine", id="stop_engine"),
        Binding("r", "restart_engine", "restart engine", id="restart_engine"),
    ]

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node
        self.where = f"Node {node}"

    def compose_body(self) -> ComposeResult:
        yield SafeStatic(id="node-info")  # the host, versions, errors: the agent's words
        self.gpu_fit = Fitted(self, GPU_COLUMNS, "node-gpus", self._redraw, GPU_SPARE)
        self.engine_fit = Fitted(self, ENGINE_COLUMNS, "node-engines", self._redraw, ENGINE_SPARE)
        yield from self.gpu_fit.compose()
        yield from self.engine_fit.compose()

    def _redraw(self) -> None:
        self.redraw()

    def draw(self, built: ViewBuilt) -> None:
        state = built.states.get(self.node)
        row = next((n for n in built.view.nodes if n.name == self.node), None)
        info = self.query_one("#node-info", Static)
        if state is None or row is None:
            info.update(Text(f"no node named {self.node!r} in this fleet", style="bold red"))
            return
        snap = state.snapshot
        t = Text()
        t.append(f"{self.node} ", style="bold")
        t.append_text(fmt.status(row.status))
        if state.no_token:
            t.append(f" ({state.error})", style="yellow")
            t.append("  set it and restart the console to watch this node", style="dim")
        else:
            t.append(f"  via {row.transport}  snapshot age ")
            t.append_text(fmt.age(state.age()))
        if state.error and row.status not in ("up", "no token"):
            t.append(f"  last error: {state.error}", style="red")
        if snap is not None:
            h = snap.host
            t.append("\nhost  cpu ")
            t.append_text(fmt.pct(h.cpu_pct, style=""))
            t.append(f"  load {h.load1:.2f}" if h.load1 is not None else "  load ?")
            t.append("  mem ")
            t.append_text(fmt.gib(h.mem_used_bytes, h.mem_total_bytes))
            for disk in h.disks:
                t.append(f"  disk {disk.path} ")
                t.append_text(
                    fmt.gib(disk.used_bytes, disk.total_bytes)
                    if not disk.error
                    else Text(disk.error, style="red")
                )
            t.append("\nversions  ")
            t.append(f"driver {snap.driver_version or '?'}  CUDA {snap.cuda_driver_version or '?'}")
            t.append(f"  {engine_summary(snap.engines)}")
            if snap.gpu_status != "ok":
                t.append(f"\nGPUs: {snap.gpu_status}", style="yellow")
            if snap.source != "agent":
                t.append(f"\nread by {snap.source}", style="cyan")
            for gap in snap.missing:
                t.append(f"\nnot shown: {gap}", style="dim yellow")
            for trt in snap.trt_engines:
                t.append(f"\nTensorRT-LLM {trt.deployment}  ")
                if trt.state == "stale":
                    t.append(stale_badge(trt), style=BADGE_STYLE)
                    t.append(f" {'; '.join(trt.reasons)}", style="yellow")
                elif trt.state == "current":
                    t.append(f"engine current (build {trt.build_key})", style="green")
                else:
                    t.append("; ".join(trt.reasons) or "unknown provenance", style="dim yellow")
                last = trt.last_drill
                if last:
                    took = last.get("time_to_rebuild_s") or last.get("total_s")
                    t.append(f"  last drill {last['state']} ({took:.0f} s)", style="dim")
            running = [j for j in snap.jobs if j.state in ("queued", "running")]
            if running:
                t.append(f"\njobs running: {', '.join(f'{j.kind} {j.id}' for j in running)}")
                t.append("  (j: jobs)", style="dim")
        blocked = self.console.action_blocked(self.node)
        if blocked:
            t.append(f"\nactions disabled: {blocked}", style="dim yellow")
        info.update(t)
        if self.gpu_fit.ready() and self.engine_fit.ready():
            self._draw_gpus(snap, built.history)
            self._draw_engines(snap)

    def _draw_gpus(self, snap: Snapshot | None, history: History) -> None:
        rows: list[Row] = []
        thresholds = self.console.fleet.thresholds
        fit = self.gpu_fit.fit
        room = fit.room
        if snap is not None:
            models = {e.id: ", ".join(m.name for m in e.models) for e in snap.engines}
            for g in snap.gpus:
                rings = history.gpu(self.node, g.index)

                def series(
                    name: str, _rings: dict[str, Series] = rings or {}
                ) -> list[float | None]:
                    ring = _rings.get(name)
                    return ring.values() if ring is not None else []

                runs = []
                for p in g.processes or []:
                    owner = p.engine_id or p.name or str(p.pid)
                    model = models.get(p.engine_id or "", "")
                    mem = f" {p.used_memory_bytes / 2**30:.0f}G" if p.used_memory_bytes else ""
                    runs.append(f"{owner}{':' + model if model else ''}{mem}")
                cells = (
                    Text(str(g.index), style="bold"),
                    fmt.pct(g.utilization_pct),
                    fmt.sparkline(series("util"), width=16).append(" "),
                    fmt.gib(g.memory_used_bytes, g.memory_total_bytes),
                    fmt.sparkline(series("mem_pct"), width=8).append(" "),
                    fmt.temp(
                        g.temperature_c, thresholds.gpu_temp_warn_c, thresholds.gpu_temp_crit_c
                    ),
                    fmt.sparkline(series("temp"), lo=20, hi=100, width=8).append(" "),
                    fmt.watts(g.power_w, g.power_limit_w),
                    fmt.sparkline(series("power"), lo=0, hi=g.power_limit_w or 700, width=8).append(
                        " "
                    ),
                    fmt.fit("; ".join(runs) or "idle", room, "" if runs else "dim"),
                )
                fields = {
                    "gpu": g.index,
                    "util": g.utilization_pct,
                    "temp": g.temperature_c,
                    "power": g.power_w,
                }
                rows.append(Row(str(g.index), fit.pick(cells), fields, " ".join(runs)))
        self.query_one("#node-gpus", FleetTable).show(rows, self.filter)

    def _draw_engines(self, snap: Snapshot | None) -> None:
        rows: list[Row] = []
        weights = {d.id: d.weight for m in self.console.fleet.models for d in m.deployments}
        width = dict(ENGINE_COLUMNS)
        fit = self.engine_fit.fit
        if snap is not None:
            for e in snap.engines:
                # The same word as on Models: every deployment it serves has weight 0.
                standby = bool(e.deployment_ids) and all(
                    weights.get(d) == 0 for d in e.deployment_ids
                )
                if standby and e.state == "down":
                    reason = fmt.fit(STANDBY_REASON, fit.room, "dim")
                elif e.reason:
                    reason = fmt.fit(e.reason, fit.room, "yellow")
                else:
                    profile = f"started from profile {e.profile}" if e.profile else ""
                    reason = fmt.fit(profile, fit.room, "dim")
                cells = (
                    fmt.fit(e.id, width["ENGINE"] or 0, style="bold"),
                    fmt.fit(e.kind, width["KIND"] or 0),
                    fmt.fit(e.version or "?", width["VERSION"] or 0),
                    fmt.engine_state(e.state, standby),
                    fmt.fit(", ".join(m.name for m in e.models) or "-", width["MODELS"] or 0),
                    reason,
                )
                state = "standby" if standby and e.state == "down" else e.state
                fields = {"engine": e.kind, "state": state}
                rows.append(Row(e.id, fit.pick(cells), fields, e.id))
        if not rows:
            why = (
                "no engine process or deployment found on this node"
                if snap is not None
                else "no snapshot from this node: nothing is known about its engines"
            )
            rows.append(empty_row(len(fit.shown), fmt.fit(why, fit.room).plain))
        self.query_one("#node-engines", FleetTable).show(rows)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ACTIONS and self.console.action_blocked(self.node):
            return None  # shown, dimmed: the info line says why
        return True

    def action_start_vllm(self) -> None:
        self.console.start_vllm(node=self.node)

    def _selected_engine(self) -> str | None:
        row = self.query_one("#node-engines", FleetTable).selected()
        if row is None or row.key == "-":
            self.notify("select an engine in the engines table first", severity="warning")
            return None
        return row.key

    def action_stop_engine(self) -> None:
        engine = self._selected_engine()
        if engine is not None:
            self.console.stop_engine(self.node, engine)

    def action_restart_engine(self) -> None:
        engine = self._selected_engine()
        if engine is not None:
            self.console.stop_engine(self.node, engine, restart=True)

    @on(DataTable.RowSelected, "#node-engines")
    def _open_engine(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value != "-":
            self.console.open_engine(self.node, str(event.row_key.value))
