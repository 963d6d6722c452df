"""Models: each model with all its deployments across engines, side by side.

SLO is each deployment's one verdict (console/core/slo.py), judged on what clients feel:
"ok", how many times its limit the worst figure is ("1.3x" a warning in yellow, "88x"
critical in red), "?" when a figure it is bound by is unknown, "?mean" when the engine
gives only windowed means (Triton's counters): a mean is never a p95. The p95 columns
show p95s only; the means have columns of their own, labelled `mean`. Latencies are
coloured against the model's SLO by the same scale. The header's second line says where
each latency was measured: at the engine (its own histograms, from the moment the engine
got the request) or at the gateway (as clients feel it); GAP is the difference
(console.collect.views.measured).

Every column is one character wider than the widest value its formatter can produce, so
a value never runs into the next column (the table has no cell padding). Where the
terminal is too narrow for them all, whole columns are dropped from the right, and the
line under the table names them (console/tui/columns.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from console.collect.views.gateway_view import GatewayDeployment, GatewayView
from console.collect.views.measured import gap_text, ttft_gap_s
from console.collect.views.view import DeploymentRow
from console.core.config.load import Fleet, Model, Slo
from console.core.slo import Level
from console.tui import format as fmt
from console.tui.built import ViewBuilt
from console.tui.columns import Fitted
from console.tui.screens.base import ViewScreen
from console.tui.screens.drills import BADGE_STYLE, stale_badge
from console.tui.widgets.table import FleetTable, Row
from console.tui.widgets.top_diagnosis import TopDiagnosis, models_key, point

# The order an on-call engineer reads in: state, then TTFT where the engine measured it,
# where clients felt it (the gateway) and the gap, before anything else; at 80 columns
# those stay on screen whole.
COLUMNS = [
    ("MODEL / DEPLOYMENT", 22),  # widened by name_width() for long ids and the badge
    ("STATE", 10),  # "unhealthy"
    ("SLO", 6),  # "ok", "1.3x", "88x", "?mean": the verdict (console/core/slo.py)
    ("TTFT95\nengine", 7),  # latencies: at most five characters ("999ms", "9.99s")
    ("TTFT95\ngateway", 8),
    ("GAP\ngw-eng", 8),  # "+999ms"
    ("ITL95\nengine", 7),
    ("ITL95\ngateway", 8),
    ("E2E95\nengine", 7),
    ("E2E95\ngateway", 8),
    ("ENGINE", 18),  # "triton 2.51.0-sim"
    ("RATE", 7),  # "9.9k/s"
    ("QUEUE", 6),  # "9999", "12k"
    ("KV", 5),  # "100%"
    ("ERR", 6),  # "100%", "<0.5%"
    ("W", 5),  # "9999"
    ("NODE", 9),  # widened by node_width()
    ("TTFT50\nengine", 7),
    ("TTFT\nmean", 7),  # Triton's counters give means: here, never in a p95 column
    ("ITL\nmean", 7),
]
NAME, ENGINE, NODE = 0, 10, 16
# The columns a narrow terminal drops first, in this order (console/tui/columns.py): the
# means and TTFT50, where it runs and on what, e2e (an SLO seldom bounds it), then the
# load; the live weight (W), the verdict and TTFT stay longest.
SPARE = (19, 18, 17, 16, 10, 9, 8, 11, 14, 13, 12, 5, 15, 7, 6)
LEVEL_STYLE: dict[Level, str] = {
    "ok": "green",
    "warning": "bold yellow",
    "critical": "bold red",
    "unknown": "dim",
}


BADGE = " REBUILD REQUIRED"  # the longer of the two (drills.stale_badge), for the width


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
    gw: GatewayDeployment | None = None,
    shown: Fitted | None = None,
) -> Row:
    """`gw`: this deployment at the gateway (live weight, its own p95s);
    `shown`: the columns the terminal's width holds (all of them without)."""
    # Everything but the key is worked out when first asked for: a draw makes 2,000 of
    # these at 1,000 nodes, and formats only the ~40 on screen (and a filter the fields).
    s = r.stats
    lat = s.latency if s else None
    slo = model.slo
    widths = dict(shown.spec) if shown is not None else {}
    name_w = widths.get(COLUMNS[NAME][0]) or 1000
    node_w = widths.get(COLUMNS[NODE][0]) or 1000
    pick = shown.fit.pick if shown is not None else None

    def cells() -> tuple[Text, ...]:
        gap = ttft_gap_s(lat.ttft_s if lat else None, gw)
        name = Text("   " + (r.id or f"({r.engine_id}, undeclared)"))
        if r.verdict.level in ("warning", "critical"):
            name.stylize(LEVEL_STYLE[r.verdict.level])
        if r.trt is not None and r.trt.state == "stale":
            name.append(stale_badge(r.trt).rstrip(), style=BADGE_STYLE)
        return (
            fmt.cut(name, name_w),
            fmt.engine_state(r.state, r.standby),
            fmt.verdict(r.verdict, r.standby),
            fmt.p95(lat.ttft_s.p95 if lat else None, slo.ttft_p95_ms),
            _at_gateway(gw, gw.ttft_p95 if gw else None, slo.ttft_p95_ms, r.standby),
            _gap(gap, gw, slo.ttft_p95_ms),
            fmt.p95(lat.itl_s.p95 if lat else None, slo.itl_p95_ms),
            _at_gateway(gw, gw.itl_p95 if gw else None, slo.itl_p95_ms, r.standby),
            fmt.p95(lat.e2e_s.p95 if lat else None, slo.e2e_p95_ms),
            _at_gateway(gw, gw.e2e_p95 if gw else None, slo.e2e_p95_ms, r.standby),
            fmt.fit(f"{r.engine} {r.version or '?'}", COLUMNS[ENGINE][1] or 0),
            fmt.rate(s.request_rate if s else None),
            fmt.count(s.requests_waiting if s else None),
            fmt.ratio(s.kv_cache_usage if s else None, kv_warn),
            fmt.error_rate(
                s.error_rate if s else None,
                slo.error_rate if slo.error_rate is not None else error_limit,
            ),
            _weight(r.weight, gw),
            fmt.fit(r.node, node_w),
            fmt.p95(lat.ttft_s.p50 if lat else None),
            fmt.mean(lat.ttft_s if lat else None),
            fmt.mean(lat.itl_s if lat else None),
        )

    def fields() -> dict[str, Any]:  # made only when a filter asks
        state = "standby" if r.standby else r.state
        stale = bool(r.trt and r.trt.state == "stale")
        revalidate = stale and r.trt is not None and r.trt.backend == "pytorch"
        gap = ttft_gap_s(lat.ttft_s if lat else None, gw)
        return {
            "model": r.model,
            "deployment": r.id,
            "engine": r.engine,
            "node": r.node,
            "state": state,
            "weight": r.weight,
            "rate": s.request_rate if s else None,
            "ttft_p95": lat.ttft_s.p95 if lat else None,
            "gw_ttft_p95": gw.ttft_p95 if gw else None,
            "gw_itl_p95": gw.itl_p95 if gw else None,
            "gw_e2e_p95": gw.e2e_p95 if gw else None,
            "ttft_gap": gap,
            "itl_p95": lat.itl_s.p95 if lat else None,
            "e2e_p95": lat.e2e_s.p95 if lat else None,
            "ttft_mean": lat.ttft_s.mean if lat else None,
            "itl_mean": lat.itl_s.mean if lat else None,
            "slo": r.verdict.level,
            "slo_times": worst.times if (worst := r.verdict.worst) else None,
            "queue": s.requests_waiting if s else None,
            "kv": s.kv_cache_usage if s else None,
            "errors": s.error_rate if s else None,
            "slo_ok": r.slo_ok,
            "rebuild": stale and not revalidate,
            "revalidate": revalidate,
        }

    def text() -> str:
        state = "standby" if r.standby else r.state
        badge = stale_badge(r.trt).rstrip().lower() if r.trt and r.trt.state == "stale" else ""
        return f"{r.model} {r.id} {r.engine} {r.node} {state}{badge}"

    key = f"d:{r.model}:{r.id or r.node + '/' + (r.engine_id or '')}"
    return Row(key, cells if pick is None else lambda: pick(cells()), fields, text)


def _weight(declared: int | None, gw: GatewayDeployment | None) -> Text:
    """The live weight when the gateway answers (bold when it differs from the file)."""
    if gw is None:
        return Text("-" if declared is None else fmt.number(declared))
    live = gw.weight
    shown = fmt.number(live) if live is not None else "?"
    return Text(shown, style="bold cyan" if live != declared else "")


def _at_gateway(
    gw: GatewayDeployment | None, p95: float | None, slo_ms: float | None, standby: bool
) -> Text:
    """A p95 the gateway measured (TTFT, ITL, e2e), as clients felt it."""
    if gw is None:
        return Text("-", style="dim")
    if gw.down:
        # A stopped standby is not an outage: one word for one state, as STATE says.
        return Text("standby", style="dim") if standby else Text("down", style="bold red")
    return fmt.p95(p95, slo_ms)


def _gap(gap: float | None, gw: GatewayDeployment | None, slo_ms: float | None) -> Text:
    """Gateway minus engine TTFT p95. Yellow when the gap is what breaks the SLO: the
    engine is within it and clients are not, so the time goes before the engine."""
    at_gateway = gw.ttft_p95 if gw else None
    if gap is None or at_gateway is None:
        return Text("-", style="dim")
    if gap < 0:
        # No client is faster than the engine: within the measurements' error it reads
        # "~0", past it "?" (console/collect/views/measured.py, docs/gateway.md).
        return Text(gap_text(gap, at_gateway - gap, fmt.seconds), style="dim")
    breaks = (
        slo_ms is not None
        and at_gateway is not None
        and at_gateway * 1000 > slo_ms >= (at_gateway - gap) * 1000
    )
    return Text(fmt.signed_seconds(gap), style="bold yellow" if breaks else "")


def model_head(name: str, model: Model, level: Level, error_limit: float) -> tuple[Text, ...]:
    """The model's row: its name (coloured by its worst deployment's verdict), and its SLO
    limits above the columns they bound."""
    slo = model.slo

    def limit(ms: float | None) -> Text:
        return Text("" if ms is None else f"<{fmt.seconds(ms / 1000)}", style="dim italic")

    err = slo.error_rate if slo.error_rate is not None else error_limit
    blank = Text("")
    style = LEVEL_STYLE[level] if level in ("warning", "critical") else "bold"
    cells = {
        NAME: Text(name, style=style),
        1: Text(
            "SLO" if any((slo.ttft_p95_ms, slo.itl_p95_ms, slo.e2e_p95_ms)) else "no SLO",
            style="dim italic",
        ),
        3: limit(slo.ttft_p95_ms),  # the engine's TTFT95
        4: limit(slo.ttft_p95_ms),  # and the gateway's: clients feel that one
        6: limit(slo.itl_p95_ms),
        7: limit(slo.itl_p95_ms),
        8: limit(slo.e2e_p95_ms),
        9: limit(slo.e2e_p95_ms),
        14: Text(f"<{fmt.percent(err)}", style="dim italic"),
    }
    return tuple(cells.get(i, blank) for i in range(len(COLUMNS)))


def _over(r: DeploymentRow | None) -> int | None:
    """How far over its SLO a row is: 0 a warning, 1 critical, None neither."""
    level = r.verdict.level if r is not None else None
    return 1 if level == "critical" else 0 if level == "warning" else None


def _level(counts: list[int]) -> Level:
    """A model's worst verdict from its rows' counts [warning, critical]."""
    return "critical" if counts[1] else "warning" if counts[0] else "ok"


@dataclass
class _Drawn:
    """Models' last draw without a filter: the view's number, the gateway snapshot it
    read, the table rows, and for each model where its row is and how many of its
    deployments are over their SLO (a warning, critical); the deployment row each table
    row was made of (None for a model's own)."""

    serial: int
    gateway: GatewayView | None
    rows: list[Row]
    offsets: dict[str, int] = field(default_factory=dict)
    breaches: dict[str, list[int]] = field(default_factory=dict)  # [warning, critical]
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
        spec = columns(self.console.fleet)
        self.fitted = Fitted(self, spec, "models", self._relaid, SPARE, header_height=2)
        yield TopDiagnosis()
        yield from self.fitted.compose()

    def __init__(self) -> None:
        super().__init__()
        # Each deployment's table row, by its view row's identity: a view keeps the rows
        # of a node whose snapshot did not change, so a draw makes rows only for those
        # that did (20,000 deployments at 10,000 nodes, on the key that opens Models).
        # With it, how far over its SLO the row is (0, 1 a warning, 2 critical).
        self._made: dict[int, tuple[DeploymentRow, GatewayDeployment | None, Row, int]] = {}
        # Each model's own row, by its name and its worst verdict (500 models).
        self._heads: dict[tuple[str, Level], Row] = {}
        # The last draw unfiltered, which the next patches where nodes changed since
        # (Changes.since) instead of walking 21,000 rows.
        self._drawn: _Drawn | None = None

    def _relaid(self) -> None:
        """Other columns for the terminal's width: every row is made again."""
        self._made, self._heads, self._drawn = {}, {}, None
        self.redraw()

    def draw(self, built: ViewBuilt) -> None:
        if not self.fitted.ready():
            return
        found = built.findings
        point(self.query_one(TopDiagnosis), self.query_one(FleetTable), found.found,
              found.counts[0] if found.counts else 0, models_key)  # fmt: skip
        gateway = built.gateway
        drawn = self._drawn
        if (
            drawn is not None
            and self.filter is None
            and (gateway is None or gateway is drawn.gateway)
            and (changed := built.changes.since(drawn.serial)) is not None
        ):
            self._patch(built, drawn, changed)
            return
        self._draw_all(built, gateway)

    def _row(
        self, built: ViewBuilt, r: DeploymentRow, name: str, gw: GatewayDeployment | None
    ) -> Row:
        t = self.console.fleet.thresholds
        model = built.spec(name)
        return deployment_row(r, model, t.kv_cache_warn, t.error_rate, gw, self.fitted)

    def _patch(self, built: ViewBuilt, drawn: _Drawn, changed: set[str]) -> None:
        view, gateway = built.view, drawn.gateway
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
                counts = drawn.breaches[name]
                if (was := _over(old)) is not None:
                    counts[was] -= 1
                if (now := _over(r)) is not None:
                    counts[now] += 1
                gw = gateway.at(name, r.id) if gateway is not None else None
                rows[at] = self._row(built, r, name, gw)
                entries[at] = r
        for name in touched:
            rows[drawn.offsets[name]] = self._head(built, name, _level(drawn.breaches[name]))
        drawn.serial, drawn.rows = view.serial, rows
        self.query_one(FleetTable).show(rows, same_keys=True)

    def _head(self, built: ViewBuilt, name: str, level: Level) -> Row:
        head = self._heads.get((name, level))
        if head is None:
            model = built.spec(name)
            cells = model_head(name, model, level, self.console.fleet.thresholds.error_rate)
            head = Row(f"m:{name}", self.fitted.fit.pick(cells), {"model": name}, name)
            self._heads[(name, level)] = head
        return head

    def _draw_all(self, built: ViewBuilt, gateway: GatewayView | None) -> None:
        view = built.view
        rows: list[Row] = []
        made, kept = {}, self._made
        heads: dict[tuple[str, Level], Row] = {}
        drawn = _Drawn(view.serial, gateway, rows)
        for name, deployments in view.models.items():
            shown = []
            counts = [0, 0]
            for r in deployments:
                gw = gateway.at(name, r.id) if gateway is not None else None
                old = kept.get(id(r))
                if old is None or old[0] is not r or old[1] is not gw:
                    over = _over(r)
                    old = (r, gw, self._row(built, r, name, gw), -1 if over is None else over)
                made[id(r)] = old
                shown.append(old[2])
                if old[3] >= 0:
                    counts[old[3]] += 1
            if self.filter is not None:
                shown = [r for r in shown if self.filter.matches(r.fields, r.text)]
                if not shown:
                    continue
            level = _level(counts)
            head = heads[(name, level)] = self._head(built, name, level)
            drawn.offsets[name], drawn.breaches[name] = len(rows), counts
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
                    for d in self.built.view.models.get(str(row.fields["model"]), [])
                    if (d.id or "") == (row.fields.get("deployment") or "")
                    and d.node == row.fields["node"]
                ),
                None,
            )
            if self.built
            else None
        )
        if engine is None:
            self.notify("this deployment's engine is not reporting", severity="warning")
            return
        self.console.open_engine(str(row.fields["node"]), engine)
