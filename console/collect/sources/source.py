"""What the console reads the fleet through: the FleetSource protocol, and what every
source keeps and says (each node's NodeState; the source's own SourceHealth).

Three sources implement it: the agents' streams and SSH (collector.py `Collector`),
Prometheus (../prometheus/source.py `PromSource`) and a recording
(../recordings/replay.py `ReplayCollector`).
The TUI and `engineroom check` use a source only through FleetSource, so neither asks
which one it holds: a source without a health of its own beyond its nodes' (the agents,
a replay) has `health` None, and one without range queries (all but Prometheus) has
`history_source()` None. This module imports no source: they import it (issue 29).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self

from console.collect.views.history import History
from console.core.snapshot import Snapshot
from console.core.units import ms_from_seconds

# "no token": the node's token variable is not set here, so it is not polled (the rest
# of the fleet is).
NodeStatus = Literal["up", "stale", "down", "unknown", "no token"]
STALE_AFTER = 2  # refreshes without a good snapshot
DOWN_AFTER = 5


@dataclass
class NodeState:
    name: str
    transport: Literal["agent", "ssh", "prometheus"]
    snapshot: Snapshot | None = None
    last_ok: float | None = None  # monotonic time of the last good snapshot
    last_attempt: float | None = None
    error: str | None = None  # the last failure, kept while the node is not up
    failures: int = 0  # consecutive
    poll_ms: float | None = None
    polls: int = 0
    no_token: str | None = None  # the unset variable that names this node's token

    def age(self, now: float | None = None) -> float | None:
        if self.last_ok is None:
            return None
        return (time.monotonic() if now is None else now) - self.last_ok

    def status(self, refresh_s: float, now: float | None = None) -> NodeStatus:
        if self.no_token is not None:
            return "no token"
        age = self.age(now)
        if age is None:
            return "down" if self.failures else "unknown"
        # A refresh is ours or the agent's, whichever is slower: an agent that takes a
        # snapshot every 2 s is not stale at 1.5 s because we look every second.
        interval = self.snapshot.cycle.get("interval_s") if self.snapshot else None
        unit = max(refresh_s, interval or 0.0)
        if age > DOWN_AFTER * unit:
            return "down"
        if age > STALE_AFTER * unit:
            return "stale"
        return "up"


@dataclass
class SourceHealth:
    """How the last refresh went: shown in the header and in `check`."""

    url: str
    ok: bool | None = None  # None: not asked yet
    error: str | None = None
    queries: int = 0  # per refresh
    failed: int = 0
    prometheus_s: float | None = None  # Prometheus' own time, summed over the queries
    wall_s: float | None = None  # the refresh, from the first query out to the last answer
    samples: int = 0
    nodes: int = 0
    full: bool | None = None  # the last refresh asked for the whole fleet (else slices)
    answered: int = 0  # queries answered so far in the first read
    last_ok: float | None = None  # monotonic
    refreshes: int = 0  # ended, whatever their outcome
    refused: int = 0  # samples refused now (out of range, not a number, ...): unknown
    refused_first: str | None = None  # the first of them, named

    def line(self) -> str:
        if self.ok is None:
            answered = f"{self.answered} of {self.queries} queries in"
            return f"prometheus {self.url}: first read under way, {answered}"
        if not self.ok:
            return f"prometheus {self.url}: {self.error}"
        took = (
            ""
            if self.prometheus_s is None
            else f", {ms_from_seconds(self.prometheus_s)} in Prometheus"
        )
        wall = f"{self.wall_s or 0:.2f} s a refresh"
        text = f"prometheus {self.url}: {self.queries} queries{took}, {wall}"
        if self.full is False:
            text += " (a slice of the fleet)"
        if self.error:
            text += f"; {self.failed} failed: {self.error}"
        if self.refused:
            text += f"; {self.refused} samples refused, shown unknown ({self.refused_first})"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ok": self.ok,
            "error": self.error,
            "queries": self.queries,
            "failed": self.failed,
            "prometheus_s": self.prometheus_s,
            "wall_s": self.wall_s,
            "samples": self.samples,
            "full": self.full,
            "nodes": self.nodes,
            "refused": self.refused,
            "refused_first": self.refused_first,
        }


@dataclass(frozen=True, slots=True)
class HistoryLine:
    """One deployment's figure over time: (unix seconds, seconds) points, oldest first."""

    node: str
    engine_id: str
    figure: str  # ttft | itl
    points: list[tuple[float, float]]


class ModelHistory(Protocol):
    """A source that can read a model's figures from before the console started (range
    queries): Model detail draws them."""

    async def model_history(self, model: str) -> list[HistoryLine]:
        """The last while of `model`'s TTFT and ITL per deployment; raises PromError
        (console/collect/prometheus/http.py) when the source gives no answer."""
        ...


class FleetSource(Protocol):
    """What the console and `check` use of a source of the fleet."""

    @property
    def states(self) -> dict[str, NodeState]: ...  # by node name, always the latest
    @property
    def history(self) -> History: ...  # each node's recent figures, for the plots
    @property
    def refresh_s(self) -> float: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def refreshes(self) -> bool: ...  # reads in refreshes and calls on_refreshed after each
    @property
    def health(self) -> SourceHealth | None: ...  # None: the nodes' states say it all

    # Called with each node's state as it changes; once a refresh's readings are all in
    # (a source that reads in refreshes). Each has one subscriber: the console sets them
    # once, to its own (EngineroomApp._node_updated, which tells any it found there last).
    on_update: Callable[[NodeState], None] | None
    on_refreshed: Callable[[], None] | None

    def history_source(self) -> ModelHistory | None:
        """Where Model detail reads a model's past from; None for a source without."""
        ...

    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, *exc: object) -> None: ...
    def start(self) -> None:
        """Read the fleet in the background until the source is closed."""
        ...

    async def poll_all(self) -> dict[str, NodeState]:
        """Read every node once (`engineroom check`)."""
        ...

    async def roles(self, found: Callable[[str, str], None], at_once: int = 16) -> None:
        """Ask each agent what our token may do: `found(node, role)` per answer."""
        ...
