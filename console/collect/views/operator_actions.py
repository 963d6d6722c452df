"""How an operator action reads, one definition for the live Events screen, a recording
and its replay (no Textual here).

An action is an agent's job (start, stop, restart, drill: each node's snapshot carries
its recent ones) or a row of the gateway's audit log (a failover job created or ended, a
weight change, a reload). `ActionTracker` turns what was seen into action records, the
dicts a recording stores: a job when it first shows up, moves a step or ends; an audit
row once. `event_of` turns a record into the Event the Events screen lists, with who and
why. The live console feeds its Events from the tracker; `engineroom record` writes the
same records; replay reads them back through `event_of`: the three read the same.

The gateway's failover jobs (GET /admin/jobs) become `Job`s too (`gateway_job`), so the
Jobs screen lists them beside the agents' jobs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from console.collect.clients.gateway_client import GatewayClient, GatewayError
from console.collect.views.alerts import Event
from console.core.gateway_wire import FailoverJob
from console.core.snapshot import Job, SnapshotError, job_from

# The kinds of event a record may have; "active": an alert already raised when the
# recording began (its start is not known).
KINDS = ("raised", "active", "cleared", "action")
MAX_KNOWN = 10_000  # jobs and audit rows remembered to tell what is new; oldest forgotten
GATEWAY = "gateway"  # where a gateway job runs, in the Jobs screen's NODE column
AUDIT_KEY = ("time", "who", "action")  # with the params: what tells one audit row apart
AUDIT_EVERY_S = 5.0  # the gateway's audit log: a few rows a minute at most


def job_target(job: Job) -> str:
    """What a job acts on: the launch profile, the engine, the drill, or the deployment a
    failover moves the traffic to."""
    p = job.params
    return str(p.get("profile") or p.get("engine") or p.get("drill") or p.get("to") or "")


def gateway_job(raw: FailoverJob | dict[str, Any]) -> Job | None:
    """A gateway failover job (console.core.gateway_wire.FailoverJob, or its fields) as a
    Job; None for one that does not read as a job."""
    if isinstance(raw, FailoverJob):
        raw = raw.model_dump()
    if not isinstance(raw, dict):
        return None
    known = ("id", "kind", "state", "who", "created", "updated", "params", "steps", "error")
    fields = {k: raw[k] for k in known if k in raw}
    # What the Job has no field for (before/after weights, verification) is its result.
    fields["result"] = {k: v for k, v in raw.items() if k not in known}
    try:
        return job_from(fields)
    except SnapshotError:
        return None


class _Seen:
    """Keys seen, with a value each, at most MAX_KNOWN: the oldest is forgotten first."""

    def __init__(self) -> None:
        self.items: dict[Any, Any] = {}

    def put(self, key: Any, value: Any) -> None:
        if key not in self.items and len(self.items) >= MAX_KNOWN:
            self.items.pop(next(iter(self.items)))
        self.items[key] = value


class ActionTracker:
    """Remembers the jobs and audit rows already turned into records."""

    def __init__(self) -> None:
        self._jobs = _Seen()  # (where, job id) -> (state, {step: state})
        self._audit = _Seen()  # an audit row's identity -> None
        self._failovers = _Seen()  # gateway job id -> its params, from its "created" row

    def jobs(self, node: str, jobs: Iterable[Job]) -> list[dict[str, Any]]:
        """A record for each of `node`'s jobs that is new, moved a step or changed state."""
        out = []
        for job in jobs:
            record = self.job(node, job)
            if record is not None:
                out.append(record)
        return out

    def job(self, node: str, job: Job) -> dict[str, Any] | None:
        key = (node, job.id)
        steps = {s.name: s.state for s in job.steps}
        before = self._jobs.items.get(key)
        if before == (job.state, steps):
            return None
        self._jobs.put(key, (job.state, steps))
        head = " ".join(x for x in ("job", job.id, job.kind, job_target(job), job.state) if x)
        if before is None:
            target = {"profile", "engine", "drill", "to"}
            what = " ".join(
                f"{k}={v}" for k, v in job.params.items() if k != "why" and k not in target and v
            )
        else:
            # A step that failed is named by the job's error ("load: the engine exited"):
            # said once, so the line reads the same whether its failure was seen as it
            # happened or only at the end.
            said = job.error if job.state == "failed" and job.error else ""
            what = ", ".join(
                f"{n} {s}"
                for n, s in steps.items()
                if before[1].get(n) != s and not (s == "failed" and said.startswith(f"{n}:"))
            )
        message = head + (f": {what}" if what else "")
        if job.state == "failed" and job.error:
            message += f": {job.error}"
        return {
            "t": job.updated or time.time(),
            "kind": "action",
            "severity": "info",
            "subject": node,
            "node": node,
            "message": message,
            "who": job.who,
            "why": job.params.get("why"),
            "job": job.id,
        }

    def audit(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A record for each gateway audit row not seen before, oldest first (`rows` come
        newest first, as GET /admin/audit answers)."""
        out = []
        for row in reversed(rows):
            if not isinstance(row, dict):
                continue  # not an audit row: nothing to say of it
            raw = row.get("params")
            params: dict[str, Any] = raw if isinstance(raw, dict) else {}
            key = tuple(str(part)[:200] for part in (*map(row.get, AUDIT_KEY), params))
            if key in self._audit.items:
                continue
            self._audit.put(key, None)
            out.append(self._audit_record(row, params))
        return out

    def _audit_record(self, row: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        action = str(row.get("action", "?"))
        job_id = params.get("id")
        if action.startswith("job ") and job_id is not None:
            if action.endswith(" created"):
                self._failovers.put(str(job_id), params)
            # A job's end is audited with its id alone: its model and target are the
            # created row's.
            params = {**self._failovers.items.get(str(job_id), {}), **params}
        detail = ""
        if isinstance(params.get("weights"), dict):
            detail = " ".join(f"{d}={w}" for d, w in params["weights"].items())
        elif params.get("to"):
            detail = f"to {params['to']} ({params.get('mode', '?')})"
        if job_id is not None:  # a rollout's own rows name the rollout, not a job
            what = "rollout" if action.startswith("rollout ") else "job"
            detail += f"{', ' if detail else ''}{what} {job_id}"
        return {
            "t": _when(row.get("time")),
            "kind": "action",
            "severity": "info",
            "subject": str(params.get("model") or GATEWAY),
            "message": f"gateway: {action}" + (f": {detail}" if detail else ""),
            "who": row.get("who"),
            "why": params.get("why"),
            "source": GATEWAY,
        }


class GatewayActions:
    """What a console keeps of the gateway's actions: its failover jobs (for Jobs and the
    playbook) and the audit rows it has not shown yet (for Events). Read every
    AUDIT_EVERY_S, and at each poll while a failover runs, so its progress stays live:
    not 50 jobs a second for a screen that may not be open. `error` says why they are not
    known now."""

    def __init__(self, tracker: ActionTracker) -> None:
        self.tracker = tracker
        self.jobs: list[Job] = []
        self.error: str | None = "not read yet"
        self._next_read = 0.0

    async def read(self, client: GatewayClient) -> list[dict[str, Any]]:
        """The records of the audit rows not seen before, when a read is due."""
        running = any(j.state in ("queued", "running") for j in self.jobs)
        if self.error is None and not running and time.monotonic() < self._next_read:
            return []
        try:
            jobs = [j for raw in await client.jobs() if (j := gateway_job(raw)) is not None]
            rows = await client.audit()
        except GatewayError as exc:
            self.lost(str(exc))
            return []
        self.jobs, self.error = jobs, None
        self._next_read = time.monotonic() + AUDIT_EVERY_S
        return self.tracker.audit(rows)

    def lost(self, why: str) -> None:
        """The gateway did not answer: its jobs are unknown, not none."""
        self.jobs, self.error = [], why


def _when(value: Any) -> float:
    """An audit row's time; now, when the gateway sent none or not a time."""
    try:
        t = float(value)
    except (TypeError, ValueError, OverflowError):
        return time.time()
    return t if math.isfinite(t) and t > 0 else time.time()


def event_of(record: dict[str, Any]) -> Event:
    """The Events screen's line for a record: who, its message, then why. Who comes first:
    a job's message grows with its steps, and a narrow screen cuts the end; why is the
    longest and the least needed at a glance, so it is last."""
    message = str(record.get("message", ""))
    who, why = record.get("who"), record.get("why")
    if who or why:
        message = f"by {who or '?'}: {message}" + (f" ({why})" if why else "")
    kind = record.get("kind")
    return Event(
        float(record.get("t") or 0.0),
        kind if kind in KINDS else "action",
        str(record.get("severity", "info")),
        str(record.get("subject", "?")),
        message,
    )
