"""The fleet as the screens and `engineroom check` show it: rows built from node states.

Functions of (fleet file, node states, time), so every screen and the headless check
agree, and tests need no terminal. The console keeps one ViewBuilder, which redoes a
node's part of the view only when that node changed.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Literal

from console.collect.sources.collector import STALE_AFTER, NodeState, NodeStatus
from console.collect.views.alerts import (
    Alert,
    AlertTracker,
    deployment_alerts,
    snapshot_alerts,
    status_alert,
)
from console.collect.views.deployments import (
    DeploymentRow,
    deployment_row,
    rejudged,
    undeclared_row,
)
from console.collect.views.gateway_view import GatewayView
from console.collect.views.history import History
from console.collect.views.nodes import GpuCell, GpuNumbers, NodeRow, engine_summary
from console.core import slo
from console.core.config.load import Deployment, Fleet, Model
from console.core.snapshot import Snapshot

__all__ = [
    "Changes",
    "DeploymentRow",
    "FleetView",
    "GpuCell",
    "NodeRow",
    "Summary",
    "ViewBuilder",
    "build",
    "engine_summary",
]
UNDECLARED_KEPT = 10_000  # models served but not in fleet.toml, each made once
CHANGES_KEPT = 64  # builds whose changed nodes are kept for screens that skipped them


@dataclass
class Summary:
    name: str
    environment: str
    read_only: bool
    nodes_up: int
    nodes_stale: int
    nodes_down: int
    nodes_waiting: int  # not polled yet
    gpus: int
    util_avg: float | None
    alerts: int
    critical: int
    nodes_no_token: int = 0  # not polled: the token variable is not set here

    @property
    def unseen(self) -> int:
        """Nodes whose state this console does not know now: down, no token, not read
        yet, or stale. With any, "no alerts" would be a guess: nobody says it."""
        return self.nodes_down + self.nodes_no_token + self.nodes_waiting + self.nodes_stale

    @property
    def nodes(self) -> int:
        return self.nodes_up + self.unseen

    @property
    def status(self) -> Literal["healthy", "degraded", "unreachable"]:
        unseen = self.nodes_down + self.nodes_no_token
        if unseen and self.nodes_up + self.nodes_stale + self.nodes_waiting == 0:
            return "unreachable"
        # A node this console holds no token for is not known to be healthy.
        if self.nodes_stale or unseen or self.alerts:
            return "degraded"
        return "healthy"


@dataclass
class FleetView:
    summary: Summary
    nodes: list[NodeRow]
    gpus: list[GpuCell]
    models: dict[str, list[DeploymentRow]]
    alerts: list[Alert]
    # The same cells by node, in fleet order (the Fleet screen's grid draws a row each).
    gpus_by_node: list[tuple[str, list[GpuCell]]] = field(default_factory=list)
    # For a screen that drew an earlier view of the same builder, to patch what changed
    # since (Changes.since) instead of walking 10,000 nodes: this view's
    # number, each node's place in `nodes`, and each node's rows in `models`.
    serial: int = 0
    at: dict[str, int] = field(default_factory=dict)
    places: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    # What this build found, before the holds: `alerts` are these where the builder holds
    # (the console's, ViewBuilder(hold=True)), else the same list.
    conditions: list[Alert] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed in a ViewBuilder's views, as of its view numbered `serial`: the nodes
    each of its last CHANGES_KEPT builds may have changed, and the first view laid out
    anew (a screen that drew an older one walks the whole view)."""

    serial: int
    layout: int
    log: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def since(self, drawn: int) -> set[str] | None:
        """The nodes whose line, rows or GPUs may differ between the view numbered `drawn`
        and this one; None when a screen must walk it all: laid out anew since, or older
        than the changes kept."""
        if drawn < self.layout or drawn > self.serial:
            return None
        log = self.log
        if drawn < self.serial and (not log or log[0][0] > drawn + 1):
            return None
        return {name for serial, names in log if serial > drawn for name in names}


@dataclass(slots=True)
class _NodePart:
    """What one node gives the view, kept while its snapshot and status stay the same."""

    snapshot: Snapshot | None
    status: NodeStatus
    numbers: GpuNumbers
    engines: str
    cells: list[GpuCell]
    rows: dict[str, DeploymentRow]  # its declared deployments, by id
    extra: list[DeploymentRow]  # engines that serve a model but are in no deployment
    alerts: list[Alert]  # from the snapshot: GPUs, NVML, rebuilds
    row_alerts: dict[int, list[Alert]]  # by id() of a row above
    made: float  # monotonic time
    placed: list[DeploymentRow]  # rows, then extra: in the order of the view's places
    models: tuple[str, ...]  # each of those rows' model
    line: NodeRow | None = None  # the Fleet table's, kept while it holds
    built: bool = False  # in a view already


def _row_alert_count(part: _NodePart) -> int:
    return sum(map(len, part.row_alerts.values())) if part.row_alerts else 0


@dataclass(slots=True)
class _Walked:
    """One build's pass over every node."""

    names: list[str]  # the nodes in the source's order
    parts: dict[str, _NodePart] = field(default_factory=dict)
    ghosts: dict[str, _NodePart] = field(default_factory=dict)  # declared on no known node
    changed: list[str] = field(default_factory=list)  # their line or alerts may differ
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("up", "stale", "down", "unknown", "no token"), 0)
    )
    util: float | None = None


@dataclass(slots=True)
class _Kept:
    """Where each node's pieces are in the last view, for the next build to patch."""

    names: list[str]
    index: dict[str, int]  # each node's place in `names` and in the view's lines
    places: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # (model, row)
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)  # _NodePart.models
    cells_at: dict[str, tuple[int, int]] = field(default_factory=dict)  # first GPU, count
    grid_at: dict[str, int] = field(default_factory=dict)  # in gpus_by_node
    own: dict[str, list[Alert]] = field(default_factory=dict)  # a node's alerts, when any
    row_alerting: set[str] = field(default_factory=set)  # nodes with deployment alerts
    view: FleetView | None = None


class ViewBuilder:
    """Builds the FleetView of one fleet, again and again.

    A node's rows, GPU cells and alerts are redone only when its snapshot or its status
    changed since the last build; at 1,000 nodes the whole fleet cost about 100 ms a
    refresh (issue 15), and agents that cycle slower than the console refreshes send a
    new snapshot only every other refresh or less.

    `hold`: the alerts are held to their hysteresis (AlertTracker), as the console's are;
    without, a build's alerts are what it found (`check` reads the fleet once).
    """

    def __init__(self, fleet: Fleet, hold: bool = False) -> None:
        self.fleet = fleet
        self._models = {m.name: m for m in fleet.models}
        self._bounds: dict[str, tuple[float | None, ...]] = {}  # each model's SLO limits
        self._gateway: GatewayView | None = None  # the gateway snapshot the rows were judged on
        self._tracker = AlertTracker() if hold else None
        self._looked: set[str] = set()  # nodes seen with a snapshot in an earlier build
        self._fresh: set[str] = set()  # ... and those first seen since the last build
        self._undeclared: dict[str, Model] = {}  # models seen served, not in fleet.toml
        self._declared: dict[str, list[tuple[Model, Deployment]]] = {}
        for model in fleet.models:
            for dep in model.deployments:
                self._declared.setdefault(dep.node, []).append((model, dep))
        self._parts: dict[str, _NodePart] = {}
        self._kept: _Kept | None = None  # the last view, and where things are in it
        self._serial = 0  # the last view's
        self._layout = 0  # the first view with its places (a whole build)
        self._log: deque[tuple[int, tuple[str, ...]]] = deque(maxlen=CHANGES_KEPT)

    def node_updated(
        self,
        state: NodeState,
        refresh_s: float,
        history: History | None = None,
        now: float | None = None,
    ) -> None:
        """Make a node's part of the next view as its new snapshot arrives, so that a
        refresh only puts the parts together instead of deriving 1,000 nodes at once
        (60-100 ms that a key press waited behind, every second). An agent that sends more
        often than the console refreshes has its part made at most twice a refresh."""
        now = time.monotonic() if now is None else now
        part = self._parts.get(state.name)
        if state.snapshot is None or (
            part is not None
            and (part.snapshot is state.snapshot or now - part.made < refresh_s / 2)
        ):
            return
        status = state.status(refresh_s, now)
        self._parts[state.name] = self._part(state.name, state, status, refresh_s, now, history)

    def build(
        self,
        states: dict[str, NodeState],
        refresh_s: float,
        now: float | None = None,
        history: History | None = None,
        gateway: GatewayView | None = None,
    ) -> FleetView:
        """The view as of `now`. Each node's status is worked out again (it moves with
        time), but the last view is patched where only some nodes changed: a refresh of a
        tenth of 10,000 nodes rebuilt the 10,000 lines, 20,000 deployment rows and 80,000
        GPU cells of the whole fleet (60 ms a tick, issue 16). `gateway`: its admin
        snapshot, whose figures judge the deployments it measured (a new one judges the
        declared deployments again, not the rest of their nodes)."""
        now = time.monotonic() if now is None else now
        rejudge = gateway is not self._gateway
        self._gateway = gateway
        walked = self._walk(states, refresh_s, now, history, rejudge)
        kept = self._kept
        view = None
        if kept is not None and kept.names == walked.names:
            view = self._patched(kept, states, walked, now)
        self._serial += 1
        if view is None:
            view = self._whole(states, walked, now)
            self._layout = self._serial
            self._log.clear()
        else:
            self._log.append((self._serial, (*walked.changed, *walked.ghosts)))
        view.serial = self._serial
        for name in walked.changed:  # the rest were in a view already
            walked.parts[name].built = True
        self._parts = walked.parts  # nodes no longer in `states` are dropped
        return view

    def changes(self) -> Changes:
        """Which nodes changed in the builds kept, as of the last build: a screen asks it
        what changed since the view it last drew (Changes.since)."""
        return Changes(self._serial, self._layout, tuple(self._log))

    def _walk(
        self,
        states: dict[str, NodeState],
        refresh_s: float,
        now: float,
        history: History | None,
        rejudge: bool = False,
    ) -> _Walked:
        """Every node's status and part; which nodes' lines or alerts may have changed."""
        walked = _Walked(list(states))
        parts, changed, counts = walked.parts, walked.changed, walked.counts
        util_sum, util_count = 0.0, 0
        # Seen within two refreshes: up, whatever the node's own cycle (NodeState.status);
        # most nodes are, and this spares a call each at 10,000 nodes.
        seen_after = now - STALE_AFTER * refresh_s
        for name, state in states.items():
            last = state.last_ok
            if last is not None and last >= seen_after and state.no_token is None:
                status: NodeStatus = "up"
            else:
                status = state.status(refresh_s, now)
            part = self._parts.get(name)
            if part is None or part.snapshot is not state.snapshot or part.status != status:
                part = self._part(name, state, status, refresh_s, now, history)
            elif rejudge and part.rows:
                part = self._rejudged(part, history)
            parts[name] = part
            counts[status] += 1
            line = part.line
            if (
                not part.built
                or status != "up"  # its own alert says how long ago it was last seen
                or line is None
                or line.error != state.error
                or line.transport != state.transport
            ):
                changed.append(name)
            if status == "up" or status == "stale":
                numbers = part.numbers
                util_sum += numbers.util_sum
                util_count += numbers.util_count
        walked.util = util_sum / util_count if util_count else None
        for name in self._declared.keys() - parts.keys():  # declared on no known node
            walked.ghosts[name] = self._part(name, None, "unknown", refresh_s, now, history)
        return walked

    def _whole(self, states: dict[str, NodeState], walked: _Walked, now: float) -> FleetView:
        parts = walked.parts
        every = {**parts, **walked.ghosts}
        kept = _Kept(walked.names, {name: i for i, name in enumerate(walked.names)})
        models: dict[str, list[DeploymentRow]] = {}
        for model in self.fleet.models:
            rows = models.setdefault(model.name, [])
            for dep in model.deployments:
                kept.places.setdefault(dep.node, []).append((model.name, len(rows)))
                rows.append(every[dep.node].rows[dep.id])
        for name in walked.names:
            for row in parts[name].extra:
                rows = models.setdefault(row.model, [])
                kept.places.setdefault(name, []).append((row.model, len(rows)))
                rows.append(row)

        node_rows: list[NodeRow] = []
        cells: list[GpuCell] = []
        by_node: list[tuple[str, list[GpuCell]]] = []
        for name, state in states.items():
            part = parts[name]
            alert = status_alert(name, state, part.status, now)
            own = part.alerts if alert is None else [alert, *part.alerts]
            if own:
                kept.own[name] = own
            if part.row_alerts:
                kept.row_alerting.add(name)
            node_rows.append(self._line(name, state, part, len(own) + _row_alert_count(part)))
            kept.cells_at[name] = (len(cells), len(part.cells))
            cells.extend(part.cells)
            if part.cells:
                kept.grid_at[name] = len(by_node)
                by_node.append((name, part.cells))
        kept.row_alerting.update(name for name, p in walked.ghosts.items() if p.row_alerts)
        kept.models = {name: part.models for name, part in every.items()}
        view = FleetView(self._summary(walked, len(cells)), node_rows, cells, models, [], by_node)
        view.at, view.places = kept.index, kept.places
        self._kept = kept
        return self._with_alerts(view, kept, parts, walked.ghosts, now)

    def _patched(
        self, kept: _Kept, states: dict[str, NodeState], walked: _Walked, now: float
    ) -> FleetView | None:
        """The last view with the changed nodes' pieces put in their places; None when a
        node's rows or GPUs no longer fit them (a new engine, a GPU gone)."""
        old, parts, ghosts = kept.view, walked.parts, walked.ghosts
        if old is None:
            return None
        models = dict(old.models)
        copied: set[str] = set()
        nodes, cells, by_node = old.nodes.copy(), old.gpus, old.gpus_by_node
        for name in (*walked.changed, *ghosts):
            part = parts.get(name) or ghosts[name]
            places = kept.places.get(name, [])
            if part.models != kept.models.get(name, ()):
                return None
            for row, (model, i) in zip(part.placed, places, strict=True):
                if model not in copied:
                    models[model] = models[model].copy()
                    copied.add(model)
                models[model][i] = row
            if part.row_alerts:
                kept.row_alerting.add(name)
            else:
                kept.row_alerting.discard(name)
            state = states.get(name)
            if state is None:  # a ghost: no line, no GPUs
                continue
            start, count = kept.cells_at[name]
            if len(part.cells) != count:
                return None
            if count:
                if cells is old.gpus:
                    cells, by_node = cells.copy(), by_node.copy()
                cells[start : start + count] = part.cells
                by_node[kept.grid_at[name]] = (name, part.cells)
            alert = status_alert(name, state, part.status, now)
            own = part.alerts if alert is None else [alert, *part.alerts]
            if own:
                kept.own[name] = own
            else:
                kept.own.pop(name, None)
            line = self._line(name, state, part, len(own) + _row_alert_count(part))
            nodes[kept.index[name]] = line
        view = FleetView(self._summary(walked, len(cells)), nodes, cells, models, [], by_node)
        view.at, view.places = kept.index, kept.places
        return self._with_alerts(view, kept, parts, ghosts, now)

    def _with_alerts(
        self,
        view: FleetView,
        kept: _Kept,
        parts: dict[str, _NodePart],
        ghosts: dict[str, _NodePart],
        now: float,
    ) -> FleetView:
        """Each node's own alerts in fleet order, then each deployment's in the Models
        order; held to their hysteresis where this builder holds."""
        found: list[Alert] = []
        index = kept.index
        for name in sorted(kept.own, key=index.__getitem__):
            found.extend(kept.own[name])
        for rows in view.models.values() if kept.row_alerting else ():
            for row in rows:
                part = parts.get(row.node) or ghosts[row.node]
                found.extend(part.row_alerts.get(id(row), ()))
        alerts = found
        if self._tracker is not None:
            alerts = self._tracker.update(found, now, self._looked)
        if self._fresh:  # first seen in this build: at their next, no longer a first look
            self._looked |= self._fresh
            self._fresh = set()
        view.alerts, view.conditions = alerts, found
        view.summary.alerts = len(alerts)
        view.summary.critical = sum(a.severity == "critical" for a in alerts)
        kept.view = view
        return view

    def _summary(self, walked: _Walked, gpus: int) -> Summary:
        """The summary but its alert counts (`_with_alerts`)."""
        fleet, counts = self.fleet, walked.counts
        return Summary(
            name=fleet.fleet.name,
            environment=fleet.fleet.environment,
            read_only=fleet.read_only,
            nodes_up=counts["up"],
            nodes_stale=counts["stale"],
            nodes_down=counts["down"],
            nodes_waiting=counts["unknown"],
            gpus=gpus,
            util_avg=walked.util,
            alerts=0,
            critical=0,
            nodes_no_token=counts["no token"],
        )

    @staticmethod
    def _line(name: str, state: NodeState, part: _NodePart, alerts: int) -> NodeRow:
        """The node's Fleet line: the part's own while nothing in it changed."""
        line = part.line
        if (
            line is None
            or line.alerts != alerts
            or line.error != state.error
            or line.transport != state.transport
        ):
            n = part.numbers
            line = part.line = NodeRow(
                name=name,
                status=part.status,
                transport=state.transport,
                error=state.error,
                gpus=n.gpus,
                util_avg=n.util_sum / n.util_count if n.util_count else None,
                util_max=n.util_max,
                mem_used=n.mem_used,
                mem_total=n.mem_total,
                temp_max=n.temp_max,
                engines=part.engines,
                alerts=alerts,
                gpu_status=part.snapshot.gpu_status if part.snapshot else None,
            )
        return line

    def specs(self, view: FleetView) -> dict[str, Model]:
        """Each model of `view`, as its rows were judged (`model`): for the screens."""
        return {name: self.model(name) for name in view.models}

    def model(self, name: str) -> Model:
        """fleet.toml's model, or one it does not declare (no SLO), made once: 20,000
        deployments at 10,000 nodes made a pydantic model each, with its defaults copied
        (the view's rows and Models' both ask here). The name is an engine's, not
        fleet.toml's: not held to the file's rules for a model name, only shown."""
        model = self._models.get(name) or self._undeclared.get(name)
        if model is None:
            model = Model.model_construct(name=name)
            if len(self._undeclared) < UNDECLARED_KEPT:  # names an engine made up: bounded
                self._undeclared[name] = model
        return model

    def _part(
        self,
        name: str,
        state: NodeState | None,
        status: NodeStatus,
        refresh_s: float,
        now: float,
        history: History | None,
    ) -> _NodePart:
        fleet, gateway = self.fleet, self._gateway
        snap = state.snapshot if state is not None else None
        shown = snap if status in ("up", "stale") else None
        if shown is not None and name not in self._looked:
            self._fresh.add(name)
        rows = {
            dep.id: deployment_row(
                model, dep, state, refresh_s, self.bounds(model.name), now, status, gateway
            )
            for model, dep in self._declared.get(name, ())
        }
        declared = {row.engine_id for row in rows.values() if row.engine_id}
        extra = [
            undeclared_row(name, engine, stats, self.bounds(stats.name))
            for engine in (shown.engines if shown else ())
            if engine.id not in declared
            for stats in engine.models
        ]
        placed = [*rows.values(), *extra]
        row_alerts = self._row_alerts(placed, history)
        part = _NodePart(
            snapshot=snap,
            status=status,
            numbers=GpuNumbers.of(snap),
            engines=engine_summary(snap.engines) if snap else "",
            cells=[GpuCell(name, status, g) for g in snap.gpus] if snap else [],
            rows=rows,
            extra=extra,
            alerts=snapshot_alerts(fleet, name, shown) if shown else [],
            row_alerts=row_alerts,
            made=now,
            placed=placed,
            models=tuple(row.model for row in placed),
        )
        if state is not None:  # its line now, while all it is made of is at hand
            alerts = len(part.alerts) + _row_alert_count(part)
            self._line(name, state, part, alerts + (status in ("down", "stale")))
        return part

    def _row_alerts(
        self, rows: list[DeploymentRow], history: History | None
    ) -> dict[int, list[Alert]]:
        out = {}
        for row in rows:
            if found := list(deployment_alerts(self.fleet, row, history)):
                out[id(row)] = found
        return out

    def _rejudged(self, part: _NodePart, history: History | None) -> _NodePart:
        """The part with its declared rows judged on the new gateway snapshot; the same
        part when no verdict changed (the rest of the node is as it was)."""
        gateway = self._gateway
        rows = {
            dep_id: rejudged(row, self.bounds(row.model), gateway)
            for dep_id, row in part.rows.items()
        }
        if all(rows[i] is row for i, row in part.rows.items()):
            return part
        placed = [*rows.values(), *part.extra]
        kept = {id(r): part.row_alerts[id(r)] for r in part.extra if id(r) in part.row_alerts}
        return replace(
            part,
            rows=rows,
            placed=placed,
            row_alerts={**self._row_alerts(list(rows.values()), history), **kept},
            built=False,
        )

    def bounds(self, model: str) -> tuple[float | None, ...]:
        """A model's SLO limits (console.core.slo.limits), worked out once per model."""
        found = self._bounds.get(model)
        if found is None:
            found = slo.limits(self.fleet, self.model(model))
            if len(self._bounds) < UNDECLARED_KEPT:
                self._bounds[model] = found
        return found


def build(
    fleet: Fleet,
    states: dict[str, NodeState],
    refresh_s: float,
    now: float | None = None,
    history: History | None = None,
    gateway: GatewayView | None = None,
) -> FleetView:
    """One FleetView (for `engineroom check` and tests); the console keeps a ViewBuilder."""
    return ViewBuilder(fleet).build(states, refresh_s, now, history, gateway)
