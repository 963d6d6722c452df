"""The gateway's rollouts in a recording (issue 31, docs/rollouts.md): what a recording
keeps of each record, the schema a reader holds it to, and the events that put each
step and each start, pause, resume, abort and halt on the timeline with who and why.

What is kept is what the Rollouts screen reads (console/tui/screens/rollouttext.py): each
record's id, who, status, step under way, why it stopped, its steps (place, state, phase)
and its events, typed by the structs below, so a replay hands the screen nothing of
another shape. The plan document itself is not kept (the steps carry its deployments).
Bounded: MAX_ROLLOUTS records, MAX_ROLLOUT_STEPS steps each (a record with more is left
out, and said), each step's phase details and figures only within DETAILED_STEPS of the
step under way, MAX_ROLLOUT_EVENTS events each, every text MAX_TEXT characters.

The state goes in as `ro` records (the whole value) and `rod` diffs, like the gateway's
snapshot; the events go in as `rollout` events, like the operator's other actions. The
gateway writes each rollout event to its audit log too (console/gateway/rollouts/runner.py
`_event`; a rollout's start and end also as its job's, `job rollout created`): the
recorder leaves those rows out (`audited`) while it reads the rollouts themselves, so
each is said once.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec

from console.collect.recordings.format import MAX_TEXT, Text, Time, one_line

MAX_ROLLOUTS = 20  # records kept at a moment: the gateway lists its last 20
MAX_ROLLOUT_STEPS = 10_000  # steps in one record (the planner is measured at 10,000)
MAX_ROLLOUT_EVENTS = 200  # a record's last events (the gateway keeps 200)
DETAILED_STEPS = 50  # each side of the step under way: with phase details and figures
MAX_DEPTH = 8  # a kept record nests no deeper; what is deeper is not the record's shape
LOOKBACK_S = 3600.0  # a rollout's events older than this before the recording are not
# written when it is first seen (an ended rollout of last week is not this incident)
KIND = "rollout"  # the events' kind: the timeline's "what"; replay lists them as actions
GATEWAY = "gateway"


# -- the schema: what the screen reads of a record (console.core.gateway_wire) -------------


class _Shape(msgspec.Struct, gc=False, omit_defaults=True):
    pass


class Figures(_Shape):
    """A step's p95s over one of its windows (console.gateway.failover.verify), unknown as None."""

    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None
    error_rate: float | None = None
    requests: int | None = None
    failures: int | None = None
    source: Text | None = None


class Step(_Shape):
    model: Text = ""
    deployment: Text = ""
    node: Text = ""
    operation: Text = ""
    wave: int = 0
    canary: bool = False
    state: Text = ""
    phase: Text | None = None
    profile: Text | None = None
    drill: Text | None = None
    details: dict[Text, Text] = {}
    baseline: Figures | None = None
    canary_baseline: Figures | None = None
    verified: Figures | None = None
    served: Figures | None = None
    breach: Text | None = None
    started: Time | None = None
    ended: Time | None = None


class RolloutEvent(_Shape):
    time: Time = 0.0
    who: Text = ""
    what: Text = ""
    why: Text = ""


class Params(_Shape):
    why: Text = ""


class Capacity(_Shape):
    ready: int | None = None
    deployments: int | None = None
    keeps: int | None = None
    max_unavailable: int | None = None
    unknown: Text | None = None


class Rollout(_Shape):
    id: Text
    status: Text
    who: Text = ""
    operation: Text = ""
    current: Annotated[int, msgspec.Meta(ge=0)] = 0
    steps: Annotated[list[Step], msgspec.Meta(max_length=MAX_ROLLOUT_STEPS)] = []
    events: Annotated[list[RolloutEvent], msgspec.Meta(max_length=MAX_ROLLOUT_EVENTS)] = []
    error: Text | None = None
    weights_seen: dict[Text, dict[Text, int | float] | Text] | None = None
    capacity: dict[Text, Capacity] | None = None
    pause_asked: bool = False
    created: Time | None = None
    updated: Time | None = None
    params: Params = msgspec.field(default_factory=Params)


class Rollouts(_Shape):
    """The value of an `ro` record: the ids newest first, the records by id, and why the
    gateway did not answer the last read (what is kept is then from the read before)."""

    ids: Annotated[list[Text], msgspec.Meta(max_length=MAX_ROLLOUTS)] = []
    rollouts: dict[Text, Rollout] = {}
    error: Text | None = None


def checked(value: Any) -> Rollouts:
    """`value` as the schema reads it; ValueError (one line) for anything else."""
    try:
        return msgspec.convert(value, Rollouts)
    except (msgspec.ValidationError, RecursionError) as exc:
        raise ValueError(one_line(exc)) from None


def records_of(value: Rollouts) -> list[dict[str, Any]]:
    """The records the Rollouts screen draws, newest first, as the gateway lists them."""
    found = (value.rollouts.get(i) for i in value.ids)
    return [msgspec.to_builtins(r) for r in found if r is not None]


# -- the writer's side ----------------------------------------------------------------------


def _cut(value: Any, depth: int = 0) -> Any:
    """Outside text within the reader's bounds: every string at most MAX_TEXT characters,
    lists at most MAX_ROLLOUT_STEPS long, nothing deeper than MAX_DEPTH."""
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 1] + "\u2026"
    if depth >= MAX_DEPTH:
        return None
    if isinstance(value, dict):
        return {_cut(str(k), depth + 1): _cut(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v, depth + 1) for v in value[: MAX_ROLLOUT_STEPS + 1]]
    return value


def kept(records: list[dict[str, Any]], error: str | None = None) -> tuple[Rollouts, list[str]]:
    """What a recording keeps of the gateway's rollouts (newest first, as GET
    /admin/rollouts answers), and a line for each record left out and why."""
    notes: list[str] = []
    if len(records) > MAX_ROLLOUTS:
        notes.append(f"the gateway listed {len(records)} rollouts; the newest "
                     f"{MAX_ROLLOUTS} are recorded")  # fmt: skip
    out = Rollouts(error=_cut(error))
    for raw in records[:MAX_ROLLOUTS]:
        rid = _cut(str(raw.get("id", "?")))
        steps = raw.get("steps")
        if isinstance(steps, list) and len(steps) > MAX_ROLLOUT_STEPS:
            notes.append(f"rollout {rid}: {len(steps):,} steps, over the {MAX_ROLLOUT_STEPS:,} "
                         "a recording holds for one rollout: not recorded")  # fmt: skip
            continue
        trimmed = {k: v for k, v in raw.items() if k != "params"}
        params = raw.get("params")
        trimmed["params"] = {"why": params.get("why")} if isinstance(params, dict) else {}
        events = raw.get("events")
        if isinstance(events, list):
            trimmed["events"] = events[-MAX_ROLLOUT_EVENTS:]
        try:  # at C speed (a text over MAX_TEXT fails it: then cut, and again)
            record = msgspec.convert(trimmed, Rollout)
        except (msgspec.ValidationError, RecursionError):
            try:
                record = msgspec.convert(_cut(trimmed), Rollout)
            except (msgspec.ValidationError, RecursionError) as exc:
                why = one_line(exc)
                notes.append(f"rollout {rid}: not a rollout record ({why}): not recorded")
                continue
        n = len(record.steps)
        near = min(record.current, max(0, n - 1))
        for i, step in enumerate(record.steps):
            if abs(i - near) > DETAILED_STEPS:  # what the screen lists is near the current
                step.details, step.breach = {}, None
                step.baseline = step.canary_baseline = step.verified = step.served = None
        if record.id not in out.rollouts:
            out.ids.append(record.id)
            out.rollouts[record.id] = record
    return out, notes


def audited(row: dict[str, Any]) -> bool:
    """Whether a gateway audit row says what a rollout's record says too."""
    return str(row.get("action", "")).startswith(("rollout ", "job rollout "))


def _severity(what: str) -> str:
    if what == "halted":
        return "critical"
    return "warning" if what in ("aborted", "interrupted") else "info"


class RolloutTracker:
    """Turns what the recorder reads of the rollouts into events: each event of a
    record (started, pause asked, paused, resumed, step N done, halted, aborted,
    interrupted, succeeded) once, with the gateway's time, who and why; and each step's
    progress (it starts, a phase ends with what it found, the next begins)."""

    def __init__(self, since: float | None = None) -> None:
        self.since = (time.time() if since is None else since) - LOOKBACK_S
        self._seen: set[str] = set()  # rollout ids read before
        self._read = False  # the gateway answered once
        self._last: dict[str, tuple[float, str, str]] = {}  # id -> its last event written
        self._steps: dict[tuple[str, int], tuple[str, str | None, tuple[str, ...]]] = {}
        self._said: set[str] = set()  # notes already written

    def notes(self, notes: list[str], t: float | None = None) -> list[dict[str, Any]]:
        """A gap event for each note not said before."""
        t = time.time() if t is None else t
        fresh = [n for n in notes if n not in self._said]
        self._said.update(fresh)
        return [{"t": t, "kind": "gap", "severity": "warning", "subject": "rollouts",
                 "message": n} for n in fresh]  # fmt: skip

    def events(self, value: Rollouts) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for rid in reversed(value.ids):  # oldest first
            record = value.rollouts[rid]
            # There before the first read: how it got where it is, its events say. One
            # that shows up later started since: its steps are followed from pending.
            first = rid not in self._seen and not self._read
            self._seen.add(rid)
            # Steps first: a step's progress seen with its end sorts before the end.
            out += self._step_events(record, first)
            out += self._record_events(record, first)
        self._read = self._read or bool(value.ids) or value.error is None
        out.sort(key=lambda e: e["t"])
        return out

    def _record_events(self, record: Rollout, first: bool) -> list[dict[str, Any]]:
        events = record.events
        # Where this read takes up: after the last event written (the gateway keeps its
        # last MAX_ROLLOUT_EVENTS, so an index alone would slide).
        start = 0
        last = self._last.get(record.id)
        if last is not None:
            for i in range(len(events) - 1, -1, -1):
                e = events[i]
                if (e.time, e.what, e.who) == last:
                    start = i + 1
                    break
        fresh = [e for e in events[start:] if not first or e.time >= self.since]
        if events:
            e = events[-1]
            self._last[record.id] = (e.time, e.what, e.who)
        models = sorted({s.model for s in record.steps})
        about = f"rollout {record.id} ({record.operation} of {', '.join(models) or '-'})"
        return [
            {"t": e.time, "kind": KIND, "severity": _severity(e.what),
             "subject": f"rollout {record.id}", "message": f"{about}: {e.what}",
             "who": e.who or None, "why": e.why or None, "job": record.id, "source": GATEWAY}
            for e in fresh
        ]  # fmt: skip

    def _step_events(self, record: Rollout, first: bool) -> list[dict[str, Any]]:
        out = []
        n = len(record.steps)
        for i, step in enumerate(record.steps):
            key = (record.id, i)
            now = (step.state, step.phase, tuple(step.details))
            before = self._steps.get(key)
            self._steps[key] = now
            if first or before == now:
                continue  # first seen: how it got here is its events' to say
            old_state, old_phase, old_done = before or ("pending", None, ())
            said = [f"{p} done: {step.details[p]}" for p in step.details if p not in old_done]
            if step.state == "running" and step.phase and step.phase != old_phase:
                said.append(f"{step.phase} under way")
            if not said:
                continue  # an end (done, halted, aborted): the record's events say it
            starting = old_state != "running" and step.state == "running"
            t = step.started if starting and step.started else record.updated or time.time()
            if (end := _ended(record, step)) is not None:
                t = min(t, end)  # seen only once it had ended: it came before the end
            where = f"step {i + 1} of {n}, wave {step.wave}: {step.operation} " \
                    f"{step.deployment} on {step.node}"  # fmt: skip
            out.append(
                {"t": t, "kind": KIND, "severity": "info",
                 "subject": f"{step.model}/{step.deployment}",
                 "message": f"rollout {record.id} {where}: " + "; ".join(said),
                 "who": record.who or None, "why": record.params.why or None,
                 "job": record.id, "source": GATEWAY}
            )  # fmt: skip
        return out


def _ended(record: Rollout, step: Step) -> float | None:
    """When a step that is no longer under way ended: done, or the rollout's last halt,
    abort or interruption; None while it runs (or is pending)."""
    if step.state == "done":
        return step.ended
    if step.state in ("halted", "aborted", "interrupted"):
        return next((e.time for e in reversed(record.events) if e.what == step.state), None)
    return None
