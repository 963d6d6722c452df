"""What goes into a recording: the nodes' snapshots as the collector gets them, the alerts
the console raises and clears, the diagnoses it names (raised, verifying a move, resolved
or still there), the gateway's routes and rollouts, and the operator's actions (jobs on
the agents, failovers and weight changes in the gateway's audit log, each rollout's steps,
pauses, resumes, aborts and halts), each with who and why.

One Recorder serves both `engineroom record` (headless, `record` below) and the console's
`--record FILE`: the console hands it what it already has, so recording costs the
console a queue put per snapshot and nothing it would not do anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from console.collect.clients.gateway_client import GatewayClient, GatewayError
from console.collect.diagnose.diagnoser import Diagnoser
from console.collect.recordings.rollouts import RolloutTracker, audited, kept
from console.collect.recordings.writer import RecordingWriter
from console.collect.sources.collector import Collector, NodeState
from console.collect.views.alerts import Event, EventLog
from console.collect.views.gateway_view import GatewayView, parse
from console.collect.views.operator_actions import AUDIT_EVERY_S, ActionTracker
from console.collect.views.view import ViewBuilder
from console.core import diagnosis as d
from console.core.config.load import Fleet
from console.core.diagnosis import Diagnosis


def open_writer(fleet: Fleet, out: str | Path, by: str, **settings: Any) -> RecordingWriter:
    """A writer whose file carries the fleet file, so a replay needs nothing else."""
    try:
        text = Path(fleet.source).read_text(encoding="utf-8")
    except OSError:
        text = ""
    return RecordingWriter(out, fleet_text=text, fleet_source=str(fleet.source), by=by, **settings)


class Recorder:
    def __init__(
        self, writer: RecordingWriter, refresh_s: float, nodes: Iterable[str] = ()
    ) -> None:
        """`nodes`: the fleet's declared nodes. Alerts raised before each has been read
        once (and a refresh after) were there before the recording began: they are
        written as "active" (active at start), not as raised at its first second."""
        self.writer = writer
        self.refresh_s = refresh_s
        self._unread = set(nodes)
        self._warm_at: float | None = None if self._unread else time.time()
        self._warm_seen = False  # the alerts of the first view after every node was read
        self._last: dict[str, object] = {}  # node -> the snapshot object last handed on
        self.actions = ActionTracker()  # how an action reads: the live Events' too
        self._newest_event: Event | None = None
        self._next_audit = 0.0
        self.rollout_tracker = RolloutTracker()
        self._rollouts: list[dict[str, Any]] = []  # the gateway's last answer
        self._rollouts_said: tuple[list[dict[str, Any]], str | None] | None = None
        self._rollouts_read = False  # it answered: its rollouts' audit rows are left out
        self._rollout_running = False  # read at each poll while one runs
        self._diagnosed: dict[tuple[str, str], str] = {}  # each diagnosis's state written
        # The gateway's last snapshot, parsed only when `engineroom record`'s diagnoses ask
        # (the console, recording, has parsed its own).
        self._gateway: tuple[dict[str, Any], GatewayView | None] | None = None

    def node_updated(self, state: NodeState) -> None:
        """The collector's on_update: the snapshot if it is new, else the status alone."""
        snap = state.snapshot
        new = snap is not None and self._last.get(state.name) is not snap
        status = state.status(self.refresh_s)
        self.writer.node(state.name, snap if new else None, status, state.error)
        if self._unread and status != "unknown":  # read once, answered or not
            self._unread.discard(state.name)
            if not self._unread:
                self._warm_at = time.time()
        if new and snap is not None:
            self._last[state.name] = snap
            # An agent's job is an operator action: when it starts, moves a step, ends.
            for record in self.actions.jobs(state.name, snap.jobs):
                self.writer.event(record)

    def alerts(self, log: EventLog) -> None:
        """The alerts `log` raised or cleared since the last call (its actions are the
        jobs' and the audit's, written as they are seen)."""
        fresh: list[Event] = []
        for event in log.events:  # newest first
            if event is self._newest_event:
                break
            if event.kind != "action":
                fresh.append(event)
        if log.events:
            self._newest_event = log.events[0]
        warm = self._warm_at
        # The first view built once every node was read says what was already wrong; on
        # a loaded machine it can come later than a refresh after the last first read.
        first_view = warm is not None and not self._warm_seen
        self._warm_seen = warm is not None
        for event in reversed(fresh):
            kind = event.kind
            if kind == "raised" and (
                warm is None or first_view or event.time <= warm + self.refresh_s
            ):
                kind = "active"  # seen as the recording began: raised before it, when unknown
            self.writer.event(
                {"t": event.time, "kind": kind, "severity": event.severity,
                 "subject": event.subject, "message": event.message}
            )  # fmt: skip

    def diagnoses(self, found: list[Diagnosis], now: float | None = None) -> None:
        """Each diagnosis as it is raised, changes state (verifying a move, still there,
        resolved) and goes: the timeline says what was named, when, with what evidence,
        and whether the move made for it worked. A diagnosis there before every node was
        read (and a refresh after) is "active at start", as an alert is."""
        now = time.time() if now is None else now
        warm = self._warm_at
        seen: dict[tuple[str, str], str] = {}
        for x in found:
            seen[x.key] = x.state
            before = self._diagnosed.get(x.key)
            if before == x.state:
                continue
            if before is None:
                at_start = warm is None or now <= warm + self.refresh_s
                kind = "diagnosis active at start" if at_start else "diagnosis raised"
                held = "; ".join(f"{e.figure} {e.value}" for e in x.evidence[:3])
                first = f"; first move: {x.moves[0]}" if x.moves else ""
                message = f"{x.headline()}: {held}{first}"
            else:
                kind, message = f"diagnosis {x.state}", x.headline()
            severity = "info" if x.state == "resolved" else x.kind.severity
            self.writer.event({"t": now, "kind": kind, "severity": severity,
                               "subject": x.subject, "message": message,
                               "node": x.node})  # fmt: skip
        for (name, subject), state in self._diagnosed.items():
            if (name, subject) not in seen and state != "resolved":
                title = d.BY_NAME[name].title if name in d.BY_NAME else name
                gone = {"t": now, "kind": "diagnosis gone", "severity": "info",
                        "subject": subject, "message": f"{title}: no longer seen"}  # fmt: skip
                self.writer.event(gone)
        self._diagnosed = seen

    def gateway(self, snap: dict[str, Any]) -> None:
        self._gateway = (snap, None)
        self.writer.gateway(snap)

    @property
    def last_gateway(self) -> GatewayView | None:
        """The gateway's last snapshot, for the diagnoses; None before one came."""
        if self._gateway is None:
            return None
        snap, view = self._gateway
        if view is None:
            view = parse(snap)
            self._gateway = (snap, view)
        return view

    async def from_gateway(self, client: GatewayClient, snap: dict[str, Any] | None) -> None:
        """What a console just read from the gateway, and its audit log every few
        seconds (one more small call; a gateway that does not answer it is skipped)."""
        if snap is not None:
            self.gateway(snap)
        if time.monotonic() >= self._next_audit or self._rollout_running:
            await self.read_actions(client)

    async def read_actions(self, client: GatewayClient) -> None:
        """The gateway's rollouts, then its audit log (whose rollout rows the rollouts'
        own events then say); a read the gateway does not answer is skipped."""
        self._next_audit = time.monotonic() + AUDIT_EVERY_S
        try:
            # Recorded as the gateway said them: the records' fields, as JSON.
            self.rollouts([r.model_dump() for r in await client.rollouts()])
        except GatewayError as exc:
            self.rollouts(self._rollouts, str(exc))
        with contextlib.suppress(GatewayError):
            self.audit(await client.audit())

    def rollouts(self, records: list[dict[str, Any]], error: str | None = None) -> None:
        """The gateway's rollouts (GET /admin/rollouts, newest first) as read now, with why
        they could not be (the last ones read are kept): their state, for replay's
        Rollouts screen, and each step and pause, resume, abort or halt as an event."""
        if (records, error) == self._rollouts_said:
            return  # as last read: nothing new to write (a read a refresh while one runs)
        self._rollouts_said = (records, error)
        if error is None:
            self._rollouts, self._rollouts_read = records, True
        value, notes = kept(records, error)
        self._rollout_running = any(r.status == "running" for r in value.rollouts.values())
        self.writer.rollouts(msgspec.to_builtins(value))
        for event in self.rollout_tracker.notes(notes) + self.rollout_tracker.events(value):
            self.writer.event(event)

    def audit(self, rows: list[dict[str, Any]]) -> None:
        """The gateway's audit rows not yet written: failovers, weight changes, reloads
        (a rollout's rows are its record's events, once the rollouts are read)."""
        if self._rollouts_read:
            rows = [r for r in rows if not audited(r)]
        for record in self.actions.audit(rows):
            self.writer.event(record)


async def poll_gateway(fleet: Fleet, recorder: Recorder, stop: asyncio.Event) -> None:
    """The gateway's snapshot each refresh and its audit log every few seconds, until
    `stop`; a gateway that does not answer is tried again at the next refresh."""
    refresh = fleet.fleet.refresh_s
    client = GatewayClient(fleet, timeout=max(1.0, 2 * refresh))
    try:
        while not stop.is_set():
            try:
                snap: dict[str, Any] | None = await client.snapshot()
            except GatewayError:
                snap = None
            await recorder.from_gateway(client, snap)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), refresh)
        await recorder.read_actions(client)  # the last actions before the end
    finally:
        await client.close()


async def record(fleet: Fleet, out: str | Path, for_s: float | None) -> int:
    """`engineroom record`: the fleet into `out` until `for_s` passed or SIGTERM/SIGINT."""
    writer = open_writer(fleet, out, "record")
    recorder = Recorder(writer, fleet.fleet.refresh_s, (n.name for n in fleet.nodes))
    collector = Collector(fleet, on_update=recorder.node_updated)
    views, log = ViewBuilder(fleet, hold=True), EventLog()  # alerts held as in the console
    diagnoser = Diagnoser(fleet)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    end = None if for_s is None else time.monotonic() + for_s
    print(f"engineroom record: {len(fleet.nodes)} nodes into {out}", file=sys.stderr, flush=True)
    gateway = None
    try:
        async with collector:
            collector.start()
            if GatewayClient.configured(fleet):
                gateway = asyncio.create_task(poll_gateway(fleet, recorder, stop))
            while not stop.is_set() and (end is None or time.monotonic() < end):
                view = views.build(collector.states, collector.refresh_s, history=collector.history)
                log.update(view.alerts)
                recorder.alerts(log)
                found = diagnoser.update(view, collector.states, recorder.last_gateway)
                recorder.diagnoses(found)
                wait = (
                    collector.refresh_s
                    if end is None
                    else min(collector.refresh_s, max(0.0, end - time.monotonic()))
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
            stop.set()
            if gateway is not None:
                await asyncio.wait_for(gateway, 15)
    finally:
        writer.close()
    print(
        f"engineroom record: {writer.written_bytes} bytes written to {out}"
        + (f"; {writer.dropped} updates dropped (queue full)" if writer.dropped else ""),
        file=sys.stderr,
    )
    return 0
