"""What a screen draws from: ViewBuilt, one typed value per view the console builds.

The snapshot's way, one way: the fleet source tells the app's one subscriber of each
node's new state (EngineroomApp._node_updated: the recording, the ViewBuilder, Events'
actions); once a refresh, EngineroomApp.tick builds the FleetView, looks for diagnoses,
and puts all a screen draws into one ViewBuilt, which it hands to the screen on top
(ViewScreen.show_built). A screen keeps the last value it was handed and redraws from it
(a filter, a resize); it never reaches back into the app for data, only for moves
(ConsoleHost: open_node, fail_over, ...). A screen that comes on top is handed the last
value at once (EngineroomApp._screen_changed), so it draws before the next refresh.

The handing is a call, not a posted Textual message: the tick's draw stays in the tick
(the scale benchmark's `tick_ms` and key-to-screen measure it there), and a screen draws
the view in the same turn of the event loop it was built in, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from console.collect.sources.source import NodeState, SourceHealth
from console.collect.views.alerts import Event
from console.collect.views.gateway_view import GatewayView
from console.collect.views.history import History
from console.collect.views.view import Changes, FleetView
from console.core.config.load import Model
from console.core.snapshot import Job
from console.core.units import ms_from_seconds
from console.tui.diagnosing import Findings


@dataclass(frozen=True, slots=True)
class Header:
    """What the header says besides the fleet's summary, as of this view."""

    read_only: bool
    simulated: bool
    replay_label: str | None  # the replayed time, in a replay
    source_problem: str | None  # Prometheus slow, down or erring (source_problem below)
    source_note: str | None  # a healthy Prometheus source's cost
    redraw_s: float | None  # --slow-link: how often the screen is redrawn at most


@dataclass(frozen=True, slots=True)
class ViewBuilt:
    """One view the console built, and what else the screens draw as of it."""

    view: FleetView
    changes: Changes  # which nodes changed since an earlier view (Changes.since)
    # Each model of the view: fleet.toml's, or one made for a model it does not declare.
    specs: Mapping[str, Model]
    gateway: GatewayView | None  # the gateway's routes and figures (None: not read)
    gateway_error: str | None  # why the gateway did not answer
    findings: Findings  # the diagnoses as of this view
    # The source's node states and recent figures (a detail screen's snapshot, its plots):
    # the source's own, always its newest.
    states: Mapping[str, NodeState]
    history: History
    events: tuple[Event, ...]  # alerts raised and cleared, operator actions; newest first
    gateway_jobs: tuple[Job, ...]  # the gateway's failover jobs, as last read
    gateway_blind: str | None  # why the gateway's actions are unknown (None: read)
    header: Header

    def spec(self, name: str) -> Model:
        """The model named `name`, as the view judged its rows."""
        spec = self.specs.get(name)
        return spec if spec is not None else Model.model_construct(name=name)


def source_problem(health: SourceHealth | None) -> str | None:
    """What the header says when the fleet's source is in trouble (Prometheus slow, down
    or erring, or samples refused); None when it is fine or the console reads the agents."""
    if health is None or (health.ok is not False and not health.failed and not health.refused):
        return None
    return health.line()


def source_note(health: SourceHealth | None) -> str | None:
    """A healthy Prometheus source's cost, for the end of the header: queries a refresh
    and Prometheus' own time."""
    if health is not None and health.ok is None:  # what has come is shown meanwhile
        return f"prometheus first read: {health.answered} of {health.queries} queries in"
    if health is None or not health.ok or health.failed:
        return None
    took = ms_from_seconds(health.prometheus_s)
    sliced = ", a slice of the fleet" if health.full is False else ""
    return f"prometheus {health.queries} queries {took}{sliced}"
