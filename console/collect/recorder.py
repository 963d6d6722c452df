"""What goes into a recording: the nodes' snapshots as the collector gets them, the alerts
the console raises and clears, the gateway's routes, and the operator's actions (jobs on
the agents, failovers and weight changes in the gateway's audit log), each with who and
why.

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
from pathlib import Path
from typing import Any

from console.collect.alerts import Event, EventLog
from console.collect.collector import Collector, NodeState
from console.collect.gateway_client import GatewayClient, GatewayError
from console.collect.recording_writer import RecordingWriter
from console.collect.view import ViewBuilder
from console.core.config import Fleet
from console.core.snapshot import Job

AUDIT_EVERY_S = 5.0  # the gateway's audit log: a few rows a minute at most
MAX_KNOWN_JOBS = 10_000  # job states remembered to tell what changed; oldest forgotten


def open_writer(fleet: Fleet, out: str | Path, by: str, **settings: Any) -> RecordingWriter:
    """A writer whose file carries the fleet file, so a replay needs nothing else."""
    try:
        text = Path(fleet.source).read_text(encoding="utf-8")
    except OSError:
        text = ""
    return RecordingWriter(out, fleet_text=text, fleet_source=str(fleet.source), by=by, **settings)


class Recorder:
    def __init__(self, writer: RecordingWriter, refresh_s: float) -> None:
        self.writer = writer
        self.refresh_s = refresh_s
        self._last: dict[str, object] = {}  # node -> the snapshot object last handed on
        self._jobs: dict[tuple[str, str], str] = {}  # (node, job id) -> "state/steps"
        self._newest_event: Event | None = None
        self._audit_seen: set[tuple[Any, ...]] = set()
        self._next_audit = 0.0

    def node_updated(self, state: NodeState) -> None:
        """The collector's on_update: the snapshot if it is new, else the status alone."""
        snap = state.snapshot
        new = snap is not None and self._last.get(state.name) is not snap
        status = state.status(self.refresh_s)
        self.writer.node(state.name, snap if new else None, status, state.error)
        if new and snap is not None:
            self._last[state.name] = snap
            for job in snap.jobs:
                self._job_seen(state.name, job)

    def _job_seen(self, node: str, job: Job) -> None:
        """An agent's job is an operator action: say when it starts, moves a step, ends."""
        key = (node, job.id)
        steps = ",".join(f"{s.name}:{s.state}" for s in job.steps)
        mark = f"{job.state}/{steps}"
        before = self._jobs.get(key)
        if before == mark:
            return
        if len(self._jobs) >= MAX_KNOWN_JOBS:
            self._jobs.pop(next(iter(self._jobs)))
        self._jobs[key] = mark
        what = " ".join(f"{k}={v}" for k, v in job.params.items() if k != "why")
        if before is None:
            message = f"job {job.id} {job.kind} {job.state}" + (f": {what}" if what else "")
        else:
            old_steps = dict(s.split(":", 1) for s in before.partition("/")[2].split(",") if s)
            moved = [f"{s.name} {s.state}" for s in job.steps if old_steps.get(s.name) != s.state]
            message = f"job {job.id} {job.kind} {job.state}" + (
                f": {', '.join(moved)}" if moved else ""
            )
        self.writer.event(
            {"t": job.updated or time.time(), "kind": "action", "severity": "info",
             "subject": node, "node": node, "message": message, "who": job.who,
             "why": job.params.get("why"), "job": job.id}
        )  # fmt: skip

    def alerts(self, log: EventLog) -> None:
        """The alerts `log` raised or cleared since the last call."""
        fresh: list[Event] = []
        for event in log.events:  # newest first
            if event is self._newest_event:
                break
            fresh.append(event)
        if log.events:
            self._newest_event = log.events[0]
        for event in reversed(fresh):
            self.writer.event(
                {"t": event.time, "kind": event.kind, "severity": event.severity,
                 "subject": event.subject, "message": event.message}
            )  # fmt: skip

    def gateway(self, snap: dict[str, Any]) -> None:
        self.writer.gateway(snap)

    async def from_gateway(self, client: GatewayClient, snap: dict[str, Any] | None) -> None:
        """What a console just read from the gateway, and its audit log every few
        seconds (one more small call; a gateway that does not answer it is skipped)."""
        if snap is not None:
            self.gateway(snap)
        if time.monotonic() >= self._next_audit:
            self._next_audit = time.monotonic() + AUDIT_EVERY_S
            with contextlib.suppress(GatewayError):
                self.audit(await client.audit())

    def audit(self, rows: list[dict[str, Any]]) -> None:
        """The gateway's audit rows not yet written: failovers, weight changes, reloads."""
        for row in reversed(rows):  # oldest first
            params = row.get("params") if isinstance(row.get("params"), dict) else {}
            key = (row.get("time"), row.get("who"), row.get("action"), str(params)[:200])
            if key in self._audit_seen:
                continue
            self._audit_seen.add(key)
            action = str(row.get("action", "?"))
            detail = ""
            if isinstance(params.get("weights"), dict):
                detail = " ".join(f"{d}={w}" for d, w in params["weights"].items())
            elif params.get("to"):
                detail = f"to {params['to']} ({params.get('mode', '?')})"
            self.writer.event(
                {"t": float(row.get("time") or time.time()), "kind": "action",
                 "severity": "info", "subject": str(params.get("model") or "gateway"),
                 "message": f"gateway: {action}" + (f": {detail}" if detail else ""),
                 "who": row.get("who"), "why": params.get("why"), "source": "gateway"}
            )  # fmt: skip


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
        with contextlib.suppress(GatewayError):  # the last actions before the end
            recorder.audit(await client.audit())
    finally:
        await client.close()


async def record(fleet: Fleet, out: str | Path, for_s: float | None) -> int:
    """`engineroom record`: the fleet into `out` until `for_s` passed or SIGTERM/SIGINT."""
    writer = open_writer(fleet, out, "record")
    recorder = Recorder(writer, fleet.fleet.refresh_s)
    collector = Collector(fleet, on_update=recorder.node_updated)
    views, log = ViewBuilder(fleet), EventLog()
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
