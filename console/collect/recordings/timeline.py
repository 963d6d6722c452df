"""A recording as the list a postmortem needs (`engineroom timeline FILE`, its verb in
console/commands/timeline.py).

Alerts raised and cleared, nodes and engines going down and coming back, the operator's
actions (jobs on the agents, failovers and weight changes on the gateway) and each
rollout's steps, pauses, resumes, halts and aborts (console/collect/recordings/rollouts.py)
with who and why, and at each point the p95 TTFT and ITL of the models it touches, as the engines
reported them then. Markdown pastes into a postmortem as it is; JSON is for tools.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

from console.collect.recordings.format import NodeStatus
from console.collect.recordings.reader import Cursor, FleetAt, Recording, RecordingError
from console.core.safetext import for_markdown_cell, markdown_code
from console.core.units import spaced_duration_from_seconds

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `8h`, `1h30m`: seconds. ValueError says what it takes."""
    parts = _DURATION.findall(text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != text.strip().lower():
        raise ValueError(f"--for {text!r}: use seconds or 90s, 30m, 8h, 1h30m")
    return sum(float(n) * _UNIT[u] for n, u in parts)


def parse_time(text: str, start: float) -> float:
    """A moment in a recording: `03:12:07` (UTC, on the recording's first day, or the next
    day when that is before it starts), `2026-12-01 03:12:07`, `+12:30` from the start,
    or unix seconds. ValueError says what it takes."""
    text = text.strip()
    if re.fullmatch(r"\d{9,}(\.\d+)?", text):
        return float(text)
    if re.fullmatch(r"\+\d+(:\d+){0,2}(\.\d+)?", text):
        seconds = 0.0
        for part in text[1:].split(":"):
            seconds = seconds * 60 + float(part)
        return start + seconds
    for shape in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return dt.datetime.strptime(text, shape).replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            pass
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", text):
        day = dt.datetime.fromtimestamp(start, dt.UTC)
        h, m, s = ([int(p) for p in text.split(":")] + [0])[:3]
        t = day.replace(hour=h, minute=m, second=s, microsecond=0).timestamp()
        return t + 86400 if t < start - 1 else t
    raise ValueError(
        f"cannot read {text!r} as a time: use HH:MM[:SS] (UTC), YYYY-MM-DD HH:MM:SS, "
        "+MM:SS from the start, or unix seconds"
    )


def utc(t: float, with_date: bool = False) -> str:
    shape = "%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime(shape)


@dataclass
class Entry:
    t: float
    kind: str  # alert raised | cleared | action | rollout | node down | up | engine ... | gap
    subject: str
    what: str
    severity: str = "info"
    who: str | None = None
    why: str | None = None
    p95: dict[str, dict[str, float | None]] = field(default_factory=dict)  # model -> ttft/itl


def _latency(moment: FleetAt) -> dict[str, dict[str, float | None]]:
    """Each model's worst p95 TTFT and ITL over its engines: what its users saw."""
    out: dict[str, dict[str, float | None]] = {}
    for name in moment.nodes:
        snap = moment.snapshot(name)  # typed: RecordingError if it is not a snapshot
        for engine in snap.engines if snap is not None else ():
            for model in engine.models:
                row = out.setdefault(model.name, {"ttft_s": None, "itl_s": None})
                for key, value in (
                    ("ttft_s", model.latency.ttft_s.p95),
                    ("itl_s", model.latency.itl_s.p95),
                ):
                    worst = row[key]
                    if value is not None and (worst is None or value > worst):
                        row[key] = float(value)
    return out


def _affected(entry: Entry, models: set[str], on_node: dict[str, set[str]]) -> set[str]:
    """The models an entry is about: named in its subject, served on its node, or named
    in what it says."""
    subject = entry.subject.split("/", 1)[0]
    if subject in models:
        return {subject}
    if subject in on_node:
        return on_node[subject]
    return {m for m in models if m in entry.what}


# How an alert event reads in the timeline; "active": raised before the recording began.
ALERT_KINDS = {
    "raised": "alert raised",
    "cleared": "alert cleared",
    "active": "alert active at start",
}


def build(
    recording: Recording, start: float | None = None, end: float | None = None
) -> list[Entry]:
    """The timeline between `start` and `end` (the whole recording by default)."""
    start = recording.start if start is None else start
    end = recording.end if end is None else end
    entries: list[Entry] = []
    for e in recording.events:
        t = float(e.get("t") or 0.0)
        if not start <= t <= end:
            continue
        kind = str(e.get("kind"))
        entries.append(
            Entry(t, ALERT_KINDS.get(kind, kind),
                  str(e.get("subject", "?")), str(e.get("message", "")),
                  str(e.get("severity", "info")), e.get("who"), e.get("why"))
        )  # fmt: skip
    # Every record is typed as it is read, and applying one checks that it fits: a file
    # that breaks either raises RecordingError, which says where.
    moment = FleetAt(start, source=str(recording.path))
    engines: dict[tuple[str, str], str] = {}
    status: dict[str, str | None] = {}
    changes: list[Entry] = []
    for record in recording.records(recording.block_for(start)):
        if record.t > end:
            break
        name = moment.apply(record)
        if name is None or record.t < start:
            if name is not None:
                _engine_changes(moment, name, engines, None)
                status[name] = moment.status.get(name, (None, None))[0]
            continue
        if isinstance(record, NodeStatus):
            new = record.status
            old = status.get(name)
            status[name] = new
            if old is not None and new != old and "down" in (old, new):
                changes.append(
                    Entry(record.t, "node down" if new == "down" else "node up", name,
                          record.error or new or "?",
                          "critical" if new == "down" else "info")
                )  # fmt: skip
        else:
            _engine_changes(moment, name, engines, changes, record.t)
    entries.extend(changes)
    entries.sort(key=lambda x: x.t)
    _add_latency(recording, entries)
    return entries


def _engine_changes(
    moment: FleetAt,
    node: str,
    engines: dict[tuple[str, str], str],
    out: list[Entry] | None,
    t: float = 0.0,
) -> None:
    seen = set()
    snap = moment.snapshot(node)  # typed: RecordingError if it is not a snapshot
    for engine in snap.engines if snap is not None else ():
        key = (node, engine.id)
        seen.add(key)
        state, before = engine.state, engines.get(key)
        engines[key] = state
        if out is None or before is None or before == state:
            continue
        up = state == "ready"
        models = ",".join(m.name for m in engine.models)
        out.append(
            Entry(t, "engine up" if up else f"engine {state}", f"{node}/{key[1]}",
                  f"{engine.kind} {before} -> {state}" + (f" ({models})" if models else ""),
                  "info" if up else "critical")
        )  # fmt: skip
    for key in [k for k in engines if k[0] == node and k not in seen]:
        if out is not None and engines[key] != "gone":
            out.append(
                Entry(t, "engine gone", f"{node}/{key[1]}", "no longer reported", "critical")
            )
        engines[key] = "gone"


def _add_latency(recording: Recording, entries: list[Entry]) -> None:
    """The affected models' p95 at each entry, read from the recording at that moment."""
    if not entries:
        return
    from console.collect.recordings.replay import fleet_of

    try:
        fleet = fleet_of(recording)
        models = {m.name for m in fleet.models}
        on_node: dict[str, set[str]] = {}
        for m in fleet.models:
            for d in m.deployments:
                on_node.setdefault(d.node, set()).add(m.name)
    except RecordingError:  # a fleet file that no longer parses: the snapshots name models
        models, on_node = set(), {}
    cursor = Cursor(recording, entries[0].t)
    for entry in entries:
        cursor.advance(entry.t)
        if cursor.error is not None:
            raise cursor.error
        latency = _latency(cursor.state)
        known = models | set(latency)
        for model in sorted(_affected(entry, known, on_node)):
            entry.p95[model] = latency.get(model, {"ttft_s": None, "itl_s": None})


def _cell(text: object) -> str:
    """A recording is someone else's file: every value is one escaped line of a cell."""
    return for_markdown_cell(text) if text not in (None, "") else ""


def markdown(recording: Recording, entries: list[Entry], start: float, end: float) -> str:
    fleet = recording.head.get("fleet_source", "?")
    lines = [
        f"## Timeline: {utc(start, True)} to {utc(end, True)} UTC",
        "",
        f"From the recording {markdown_code(recording.path.name)} of {markdown_code(fleet)} "
        f"(by {markdown_code('engineroom ' + str(recording.head.get('by', 'record')))}). "
        "Times are UTC. p95 TTFT / ITL: the worst "
        "engine serving the model at that moment, over the engines' own window; ? where "
        "nothing was reported.",
        "",
        "| time | what | subject | detail | who | why | p95 TTFT / ITL |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        what = e.kind + (f" ({e.severity})" if e.severity in ("critical", "warning") else "")
        p95 = "; ".join(
            f"{m} {spaced_duration_from_seconds(v['ttft_s'])} / "
            f"{spaced_duration_from_seconds(v['itl_s'])}"
            for m, v in sorted(e.p95.items())
        )
        lines.append(
            f"| {utc(e.t)} | {_cell(what)} | {_cell(e.subject)} | {_cell(e.what)} | "
            f"{_cell(e.who)} | {_cell(e.why)} | {_cell(p95)} |"
        )
    if not entries:
        lines.append("| | nothing recorded in this window | | | | | |")
    if recording.torn:
        lines += ["", f"The recording ends early: {for_markdown_cell(recording.torn)}."]
    return "\n".join(lines) + "\n"
