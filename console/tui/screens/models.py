"""Models: each model with all its deployments across engines, side by side.

Latency is coloured against the model's SLO from fleet.toml; "~" marks a windowed mean
where the engine has no histogram (Triton's default). The header's second line says where
each latency was measured: at the engine (its own histograms, from the moment the engine
got the request) or at the gateway (as clients feel it); GAP is the difference
(console.collect.measured).

Every column is one character wider than the widest value its formatter can produce, so
a value never runs into the next column (the table has no cell padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from console.collect.measured import gap_text, gateway_measure, gateway_ttft_p95, ttft_gap_s
from console.collect.view import DeploymentRow, FleetView
from console.core.config import Fleet, Model, Slo
from console.core.snapshot import Percentiles
from console.tui import format as fmt
from console.tui.screens.base import ViewScreen
from console.tui.widgets.table import FleetTable, Row

# The order an on-call engineer reads in: state, then TTFT where the engine measured it,
# where clients felt it (the gateway) and the gap, before anything else; at 80 columns
# those stay on screen whole.
COLUMNS = [
    ("MODEL / DEPLOYMENT", 22),  # widened by name_width() for long ids and the badge
    ("STATE", 10),  # "unhealthy"
    ("TTFT95\nengine", 7),  # latencies: at most six characters ("~999ms", "~9.99s")
    ("TTFT95\ngateway", 8),
    ("GAP\ngw-eng", 8),  # "+999ms"
    ("ITL95\nengine", 7),
    ("E2E95\nengine", 7),
    ("ENGINE", 18),  # "triton 2.51.0-sim"
    ("RATE", 7),  # "9.9k/s"
    ("QUEUE", 6),  # "9999", "12k"
    ("KV", 5),  # "100%"
    ("ERR", 6),  # "100%", "<0.5%"
    ("W", 5),  # "9999"
    ("NODE", 9),  # widened by node_width()
    ("TTFT50\nengine", 7),
]
NAME, ENGINE, NODE = 0, 7, 13


BADGE = " REBUILD REQUIRED"


def name_width(fleet: Fleet) -> int:
    """The first column: the longest deployment id, and room for the REBUILD REQUIRED
    badge where a deployment can carry it (a TensorRT-LLM engine_dir, or a drill's target)."""
    ids = [d.id for m in fleet.models for d in m.deployments]
    can_go_stale = {d.deployment for d in fleet.drills.values()} | {
        d.id for m in fleet.models for d in m.deployments if d.engine_dir is not None
    }
    longest = max((len(i) + (len(BADGE) if i in can_go_stale else 0) for i in ids), default=0)
    return max(22, longest + 4)


def node_width(fleet: Fleet) -> int:
    return max(9, max((len(n.name) for n in fleet.nodes), default=0) + 1)


def columns(fleet: Fleet) -> list[tuple[str, int | None]]:
    widths: list[tuple[str, int | None]] = list(COLUMNS)
    widths[NAME] = (COLUMNS[NAME][0], name_width(fleet))
    widths[NODE] = (COLUMNS[NODE][0], node_width(fleet))
    return widths


def slo_text(slo: Slo) -> str:
    parts = []
    if slo.ttft_p95_ms is not None:
        parts.append(f"ttft<{slo.ttft_p95_ms:.0f}ms")
    if slo.itl_p95_ms is not None:
        parts.append(f"itl<{slo.itl_p95_ms:.0f}ms")
    if slo.e2e_p95_ms is not None:
        parts.append(f"e2e<{slo.e2e_p95_ms:.0f}ms")
    return "SLO " + " ".join(parts) if parts else "no SLO"


def deployment_row(
    r: DeploymentRow,
    model: Model,
    kv_warn: float,
    error_limit: float,
    gw: dict[str, Any] | None = None,
) -> Row:
    """`gw`: this deployment in the gateway's snapshot (live weight, its own TTFT)."""
    # Everything but the key is worked out when first asked for: a draw makes 2,000 of
    # these at 1,000 nodes, and formats only the ~40 on screen (and a filter the fields).
    s = r.stats
    lat = s.latency if s else None
    slo = model.slo

    def cells() -> tuple[Text, ...]:
        gap = ttft_gap_s(lat.ttft_s if lat else None, gw)
        name = Text("   " + (r.id or f"({r.engine_id}, undeclared)"))
        if r.slo_ok is False:
            name.stylize("bold red")
        if r.trt is not None and r.trt.state == "stale":
            name.append(BADGE, style="bold black on yellow")
        return (
            name,
            fmt.engine_state(r.state, r.standby),
            fmt.latency(lat.ttft_s if lat else None, "p95", slo.ttft_p95_ms),
            _gateway_ttft(gw, slo.ttft_p95_ms, r.standby),
            _gap(gap, gw, slo.ttft_p95_ms),
            fmt.latency(lat.itl_s if lat else None, "p95", slo.itl_p95_ms),
            fmt.latency(lat.e2e_s if lat else None, "p95", slo.e2e_p95_ms),
            fmt.fit(f"{r.engine} {r.version or '?'}", COLUMNS[ENGINE][1] or 0),
            fmt.rate(s.request_rate if s else None),
            fmt.count(s.requests_waiting if s else None),
            fmt.ratio(s.kv_cache_usage if s else None, kv_warn),
            fmt.error_rate(
                s.error_rate if s else None,
                slo.error_rate if slo.error_rate is not None else error_limit,
            ),
            _weight(r.weight, gw),
            Text(r.node),  # the column is as wide as the longest node name
            fmt.latency(lat.ttft_s if lat else None, "p50"),
        )

    def fields() -> dict[str, Any]:  # made only when a filter asks
        state = "standby" if r.standby else r.state
        rebuild = bool(r.trt and r.trt.state == "stale")
        gap = ttft_gap_s(lat.ttft_s if lat else None, gw)
        return {
            "model": r.model,
            "deployment": r.id,
            "engine": r.engine,
            "node": r.node,
            "state": state,
            "weight": r.weight,
            "rate": s.request_rate if s else None,
            "ttft_p95": lat.ttft_s.p95_or_mean if lat else None,
            "gw_ttft_p95": gateway_ttft_p95(gw),
            "ttft_gap": gap,
            "itl_p95": lat.itl_s.p95_or_mean if lat else None,
            "e2e_p95": lat.e2e_s.p95_or_mean if lat else None,
            "queue": s.requests_waiting if s else None,
            "kv": s.kv_cache_usage if s else None,
            "errors": s.error_rate if s else None,
            "slo_ok": r.slo_ok,
            "rebuild": rebuild,
        }

    def text() -> str:
        state = "standby" if r.standby else r.state
        badge = " rebuild required" if r.trt and r.trt.state == "stale" else ""
        return f"{r.model} {r.id} {r.engine} {r.node} {state}{badge}"

    key = f"d:{r.model}:{r.id or r.node + '/' + (r.engine_id or '')}"
    return Row(key, cells, fields, text)


def _weight(declared: int | None, gw: dict[str, Any] | None) -> Text:
    """The live weight when the gateway answers (bold when it differs from the file)."""
    if gw is None:
        return Text("-" if declared is None else fmt.number(declared))
    live = gw.get("weight")
    shown = fmt.number(live) if isinstance(live, int | float) else "?"
    return Text(shown, style="bold cyan" if live != declared else "")


def _gateway_ttft(gw: dict[str, Any] | None, slo_ms: float | None, standby: bool) -> Text:
    if gw is None:
        return Text("-", style="dim")
    if not gw.get("up", True):
        # A stopped standby is not an outage: one word for one state, as STATE says.
        return Text("standby", style="dim") if standby else Text("down", style="bold red")
    p95 = gateway_ttft_p95(gw)
    if p95 is None:
        return Text("?", style="dim")
    return fmt.latency(Percentiles(p95=p95), "p95", slo_ms)


def _gap(gap: float | None, gw: dict[str, Any] | None, slo_ms: float | None) -> Text:
    """Gateway minus engine TTFT p95. Yellow when the gap is what breaks the SLO: the
    engine is within it and clients are not, so the time goes before the engine."""
    at_gateway = gateway_ttft_p95(gw)
    if gap is None or at_gateway is None:
        return Text("-", style="dim")
    if gap < 0:
        # No client is faster than the engine: within the measurements' error it reads
        # "~0", past it "?" (console/collect/measured.py, docs/gateway.md).
        return Text(gap_text(gap, at_gateway - gap, fmt.seconds), style="dim")
    breaks = (
        slo_ms is not None
        and at_gateway is not None
        and at_gateway * 1000 > slo_ms >= (at_gateway - gap) * 1000
    )
    return Text(fmt.signed_seconds(gap), style="bold yellow" if breaks else "")


def model_head(name: str, model: Model, breach: bool, error_limit: float) -> tuple[Text, ...]:
    """The model's row: its name, and its SLO limits above the columns they bound."""
    slo = model.slo

    def limit(ms: float | None) -> Text:
        return Text("" if ms is None else f"<{fmt.seconds(ms / 1000)}", style="dim italic")

    err = slo.error_rate if slo.error_rate is not None else error_limit
    blank = Text("")
    return (
        Text(name, style="bold red" if breach else "bold"),
        Text(
            "SLO" if any((slo.ttft_p95_ms, slo.itl_p95_ms, slo.e2e_p95_ms)) else "no SLO",
            style="dim italic",
        ),
        limit(slo.ttft_p95_ms),  # the engine's TTFT95
        limit(slo.ttft_p95_ms),  # and the gateway's: clients feel that one
        blank,
        limit(slo.itl_p95_ms),
        limit(slo.e2e_p95_ms),
        blank,
        blank,
        blank,
        blank,
        Text(f"<{fmt.percent(err)}", style="dim italic"),
        *[blank] * (len(COLUMNS) - 12),
    )


@dataclass
class _Drawn:
    """Models' last draw without a filter: the view's number, the gateway snapshot it
    read, the table rows, and for each model where its row is and how many of its
    deployments break their SLO; the deployment row each table row was made of (None
    for a model's own)."""

    serial: int
    gateway: dict[str, Any] | None
    rows: list[Row]
    offsets: dict[str, int] = field(default_factory=dict)
    breaches: dict[str, int] = field(default_factory=dict)
    entries: list[DeploymentRow | None] = field(default_factory=list)


class ModelsScreen(ViewScreen):
    where = "Models"
    BINDINGS = [
        Binding("e", "engine", "engine detail", id="engine_detail"),
        Binding("s", "start_vllm", "start vLLM", id="start_vllm"),
        Binding("f", "fail_over", "fail over", id="fail_over"),
        Binding("R", "run_drill", "rebuild drill", id="run_drill"),
        Binding("p", "playbook", "playbook", id="playbook"),
    ]

    def compose_body(self) -> ComposeResult:
        yield FleetTable(columns(self.console.fleet), id="models", header_height=2)

    def __init__(self) -> None:
        super().__init__()
        # Each deployment's table row, by its view row's identity: a view keeps the rows
        # of a node whose snapshot did not change, so a draw makes rows only for those
        # that did (20,000 deployments at 10,000 nodes, on the key that opens Models).
        # With it, whether the row breaks its SLO.
        self._made: dict[int, tuple[DeploymentRow, dict[str, Any] | None, Row, bool]] = {}
        # Each model's own row, by its name and whether it breaks its SLO (500 models).
        self._heads: dict[tuple[str, bool], Row] = {}
        # The last draw unfiltered, which the next patches where nodes changed since
        # (ViewBuilder.changed_since) instead of walking 21,000 rows.
        self._drawn: _Drawn | None = None

    def draw(self, view: FleetView) -> None:
        gateway = self.console.gateway_snapshot
        drawn = self._drawn
        if (
            drawn is not None
            and self.filter is None
            and (gateway is None or gateway is drawn.gateway)
            and (changed := self.console.views.changed_since(drawn.serial, view)) is not None
        ):
            self._patch(view, drawn, changed)
            return
        self._draw_all(view, gateway)

    def _patch(self, view: FleetView, drawn: _Drawn, changed: set[str]) -> None:
        fleet = self.console.fleet
        gateway = drawn.gateway
        rows, entries = drawn.rows.copy(), drawn.entries
        touched: set[str] = set()
        for node in changed:
            for name, i in view.places.get(node, ()):
                r = view.models[name][i]
                at = drawn.offsets[name] + 1 + i
                old = entries[at]
                if old is r:
                    continue
                touched.add(name)
                drawn.breaches[name] += (r.slo_ok is False) - (
                    old is not None and old.slo_ok is False
                )
                gw = gateway_measure(gateway, name, r.id) if gateway else None
                rows[at] = deployment_row(
                    r,
                    self.console.views.model(name),
                    fleet.thresholds.kv_cache_warn,
                    fleet.thresholds.error_rate,
                    gw,
                )
                entries[at] = r
        for name in touched:
            rows[drawn.offsets[name]] = self._head(name, drawn.breaches[name] > 0)
        drawn.serial, drawn.rows = view.serial, rows
        self.query_one(FleetTable).show(rows, same_keys=True)

    def _head(self, name: str, breach: bool) -> Row:
        head = self._heads.get((name, breach))
        if head is None:
            model = self.console.views.model(name)
            cells = model_head(name, model, breach, self.console.fleet.thresholds.error_rate)
            head = self._heads[(name, breach)] = Row(f"m:{name}", cells, {"model": name}, name)
        return head

    def _draw_all(self, view: FleetView, gateway: dict[str, Any] | None) -> None:
        fleet = self.console.fleet
        rows: list[Row] = []
        made, kept = {}, self._made
        heads: dict[tuple[str, bool], Row] = {}
        drawn = _Drawn(view.serial, gateway, rows)
        for name, deployments in view.models.items():
            model = self.console.views.model(name)
            shown = []
            breach = 0
            for r in deployments:
                gw = gateway_measure(gateway, name, r.id) if gateway else None
                old = kept.get(id(r))
                if old is None or old[0] is not r or old[1] is not gw:
                    row = deployment_row(
                        r, model, fleet.thresholds.kv_cache_warn, fleet.thresholds.error_rate, gw
                    )
                    old = (r, gw, row, r.slo_ok is False)
                made[id(r)] = old
                shown.append(old[2])
                breach += old[3]
            if self.filter is not None:
                shown = [r for r in shown if self.filter.matches(r.fields, r.text)]
                if not shown:
                    continue
            head = heads[(name, breach > 0)] = self._head(name, breach > 0)
            drawn.offsets[name], drawn.breaches[name] = len(rows), breach
            drawn.entries.append(None)
            drawn.entries.extend(deployments)
            rows.append(head)
            rows.extend(shown)
        self._made, self._heads = made, heads
        self._drawn = drawn if self.filter is None else None
        self.query_one(FleetTable).show(rows)

    @on(DataTable.RowSelected, "#models")
    def _open(self, event: DataTable.RowSelected) -> None:
        row = self.query_one(FleetTable).rows_by_key.get(str(event.row_key.value))
        if row is not None:
            self.console.open_model(str(row.fields["model"]))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "start_vllm" and (self.console.read_only or not self.console.fleet.profiles):
            return None
        if action == "fail_over" and (
            self.console.read_only
            or self.console.fleet.gateway is None
            or self.console.gateway_role == "viewer"
        ):
            return None
        if action == "run_drill" and (self.console.read_only or not self.console.fleet.drills):
            return None
        return True

    def _selected_model(self) -> str | None:
        row = self.query_one(FleetTable).selected()
        if row is None or "model" not in row.fields:
            self.notify("select a model first", severity="warning")
            return None
        return str(row.fields["model"])

    def action_run_drill(self) -> None:
        """The rebuild drill of the selected deployment (or the model's only drill)."""
        row = self.query_one(FleetTable).selected()
        model = self._selected_model()
        if row is None or model is None:
            return
        drills = self.console.fleet.drills
        deployment = row.fields.get("deployment")
        mine = [n for n, d in drills.items() if d.deployment == deployment] or [
            n for n, d in drills.items() if d.model == model
        ]
        if not mine:
            self.notify(
                f"no [drills.NAME] for {deployment or model} in fleet.toml", severity="warning"
            )
            return
        self.console.run_drill(mine[0])

    def action_playbook(self) -> None:
        model = self._selected_model()
        if model is not None:
            self.console.open_playbook(model)

    def action_fail_over(self) -> None:
        row = self.query_one(FleetTable).selected()
        if row is None or "model" not in row.fields:
            self.notify("select a model first", severity="warning")
            return
        self.console.fail_over(str(row.fields["model"]))

    def action_start_vllm(self) -> None:
        """Start vLLM for the selected model (a standby before a failover, say)."""
        row = self.query_one(FleetTable).selected()
        model = str(row.fields["model"]) if row is not None and "model" in row.fields else None
        self.console.start_vllm(model=model)

    def action_engine(self) -> None:
        row = self.query_one(FleetTable).selected()
        if row is None or "node" not in row.fields:
            self.notify("select a deployment row first", severity="warning")
            return
        engine = (
            next(
                (
                    d.engine_id
                    for d in self.console.view.models.get(str(row.fields["model"]), [])
                    if (d.id or "") == (row.fields.get("deployment") or "")
                    and d.node == row.fields["node"]
                ),
                None,
            )
            if self.console.view
            else None
        )
        if engine is None:
            self.notify("this deployment's engine is not reporting", severity="warning")
            return
        self.console.open_engine(str(row.fields["node"]), engine)
