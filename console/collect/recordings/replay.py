"""A collector that shows recorded snapshots instead of polling: `engineroom replay`.

Two sources, one code path. A recording (console/collect/recordings/reader.py) with a time
cursor that moves (play, step, jump): every node shows its snapshot, status and error as
they were at the cursor, the gateway its routes, weights and rollouts of that moment, the
Events screen what had been raised, cleared and done by then. Or a single moment given as
snapshots (`engineroom agent --once --json` output): the screenshots of the H200
evidence and the TUI's tests render real output that way. Nothing here opens a
connection.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from console.collect.recordings.reader import Cursor, FleetAt, Recording, RecordingError
from console.collect.recordings.rollouts import Rollouts, records_of
from console.collect.sources.collector import Collector
from console.collect.views.alerts import Alert, Event, EventLog
from console.collect.views.history import History
from console.collect.views.operator_actions import event_of
from console.core.config.load import ConfigError, Fleet, parse_fleet
from console.core.snapshot import Snapshot

MARKS = ("raised", "active", "cleared", "action")  # what "next event" jumps to
SPEEDS = (1.0, 10.0, 60.0)
JUMP_S = 60.0


def fleet_of(recording: Recording) -> Fleet:
    """The fleet file the recording carries; RecordingError if it no longer parses (the
    file it names is the one in the recording, not the operator's own)."""
    from pathlib import Path

    source = Path(str(recording.head.get("fleet_source", "fleet")))
    try:
        return parse_fleet(recording.fleet_text, source)
    except ConfigError as exc:
        raise RecordingError(
            f"{recording.path}: the fleet file it carries does not read: {exc}"
        ) from None


class ReplayCollector(Collector):
    """Nodes show what was recorded: a node recorded as None is down, one not recorded yet
    is unknown."""

    def __init__(
        self,
        fleet: Fleet,
        snapshots: dict[str, Snapshot | None] | None = None,
        history_points: int = 30,
        *,
        recording: Recording | None = None,
        at: float | None = None,
    ) -> None:
        super().__init__(fleet)
        self.recording = recording
        self.history_points = history_points
        self.cursor: Cursor | None = None
        self.at = 0.0  # the replayed time (unix seconds)
        self.gateway_snapshot: dict[str, Any] | None = None
        # The gateway's rollouts at the cursor, as the Rollouts screen reads them (None:
        # none recorded by then), why the gateway did not answer then, and when read.
        self.rollouts: list[dict[str, Any]] | None = None
        self.rollouts_error: str | None = None
        self.rollouts_seen: float | None = None
        self._rollouts_from: Rollouts | None = None
        # Where a recording stops making sense (a record that breaks its schema): why, and
        # the last moment before it; the replay plays up to there.
        self.broken: str | None = None
        self._ends_at: float | None = None
        self._opened = False  # until then a record that breaks the schema is raised
        self._event_times: list[float] = []
        self._events: list[Event] = []
        if recording is not None:
            for state in self.states.values():
                # Tokens are for the live fleet: a replay reads none and calls no node.
                state.no_token, state.error = None, None
            start = recording.first_round() if at is None else at
            self.cursor = Cursor(recording, start)
            if self.cursor.error is not None:
                raise self.cursor.error  # at the start: the replay does not open
            self._events = [event_of(e) for e in recording.events]
            self._event_times = [e.time for e in self._events]
            self._show(self.cursor.state, set(self.states) | set(self.cursor.state.nodes))
        else:
            moment = FleetAt(time.time(), seen={n: time.time() for n in snapshots or {}})
            self._show(moment, set(), given=snapshots or {})
        self._keeper: asyncio.Task[None] | None = None
        self._opened = True

    # -- the cursor --------------------------------------------------------------------

    @property
    def first(self) -> float:
        """The recording's first moment."""
        return self.recording.start if self.recording else self.at

    @property
    def last(self) -> float:
        """The recording's last moment, or the last before the record that broke it."""
        if self.recording is None:
            return self.at
        if self._ends_at is not None:
            return max(self.first, min(self.recording.end, self._ends_at))
        return self.recording.end

    def move_to(self, t: float) -> None:
        """Put the cursor at `t` (clamped to the recording): forward by applying what
        came since, backward by the keyframe before `t`."""
        if self.cursor is None:
            return
        t = min(max(t, self.first), self.last)
        # A jump (back, or over a minute on; 60x play moves 6 s a tick): the plots start
        # again there rather than join two moments apart.
        jumped = t < self.cursor.state.t or t - self.cursor.state.t > JUMP_S
        changed = self.cursor.advance(t)
        if self.cursor.error is not None and self.broken is None:
            self.broken = str(self.cursor.error)
            self._ends_at = self.cursor.ended_at
        if jumped:
            self.history = History()
            changed = set(self.states) | set(self.cursor.state.nodes)
        self._show(self.cursor.state, changed)

    def marks(self) -> list[Event]:
        """The alerts raised and cleared and the operator's actions, oldest first."""
        return [e for e in self._events if e.kind in MARKS]

    def next_mark(self, forward: bool = True) -> Event | None:
        """The next (or previous) alert or action from the cursor."""
        marks = self.marks()
        times = [e.time for e in marks]
        if forward:
            i = bisect.bisect_right(times, self.at + 1e-6)
            return marks[i] if i < len(marks) else None
        i = bisect.bisect_left(times, self.at - 1e-6)
        return marks[i - 1] if i > 0 else None

    def events_until(self, limit: int = 2000) -> deque[Event]:
        """What the Events screen shows at the cursor: newest first."""
        i = bisect.bisect_right(self._event_times, self.at)
        return deque(reversed(self._events[max(0, i - limit) : i]), maxlen=limit)

    # -- the nodes' states ----------------------------------------------------------------

    def _show(
        self,
        moment: FleetAt,
        changed: set[str],
        given: dict[str, Snapshot | None] | None = None,
    ) -> None:
        self.at = moment.t
        self.gateway_snapshot = moment.gateway
        typed = moment.rollouts_typed
        if typed is not self._rollouts_from:  # made again only when they changed
            self._rollouts_from = typed
            self.rollouts = None if typed is None else records_of(typed)
            self.rollouts_error = None if typed is None else typed.error
        self.rollouts_seen = moment.rollouts_seen
        for name in set(given or ()) | changed:
            state = self.states.get(name)
            if state is None:
                continue  # a node the recording has and the fleet file no longer
            status, error = moment.status.get(name, (None, None))
            if given is not None and name in given:
                snap = given[name]
            else:
                try:
                    snap = moment.snapshot(name)
                except RecordingError as exc:
                    if not self._opened:
                        raise  # at the start: the replay does not open
                    # Later: the node shows what the file says, that it is unreadable.
                    snap, error = None, str(exc)
                    self.broken = self.broken or str(exc)
            if snap is None:
                state.snapshot, state.last_ok = None, None
                if self.recording is not None and status is None and error is None:
                    # Not in the recording by this moment: unknown (the header counts it
                    # unseen), never a made-up "connection refused".
                    state.failures, state.error = 0, "not recorded yet"
                else:  # recorded down, or given as None (a node that did not answer)
                    state.failures, state.error = 3, error or "connection refused"
                continue
            fresh = state.snapshot is not snap
            state.snapshot = snap
            state.failures = 0 if status in (None, "up", "stale") else 1
            state.error = error
            if fresh:
                # One moment stands for the whole plot; a recording draws its own.
                points = self.history_points if self.recording is None else 1
                for _ in range(points):
                    self.history.record(name, snap)
        self._seen = dict(moment.seen)
        self._age_nodes()

    def _age_nodes(self) -> None:
        """Each node's age is its age at the cursor, however long the replay is paused."""
        now = time.monotonic()
        for name, seen in self._seen.items():
            state = self.states.get(name)
            if state is not None and state.snapshot is not None:
                state.last_ok = now - max(0.0, self.at - seen)

    async def __aenter__(self) -> ReplayCollector:
        return self  # no session: a replay opens no connection

    async def roles(self, found: Callable[[str, str], None], at_once: int = 16) -> None:
        """A replay asks no agent what its token may do (it opens no connection)."""

    def start(self) -> None:
        self._keeper = asyncio.create_task(self._keep_aged())

    async def _keep_aged(self) -> None:
        while True:
            self._age_nodes()
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper


class RecordedEvents(EventLog):
    """The Events screen in a replay: what the recording says happened up to the cursor
    (the live alerts of the replayed view are not raised again)."""

    def __init__(self, collector: ReplayCollector) -> None:
        super().__init__()
        self.collector = collector
        self.events = collector.events_until()

    def update(self, alerts: list[Alert], now: float | None = None) -> None:
        self.events = self.collector.events_until()
