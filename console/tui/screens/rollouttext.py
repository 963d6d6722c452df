"""A rollout as the Rollouts screen writes it (console/tui/screens/rollouts.py): where it
is, why it stopped, its waves, each deployment's state and figures, its events.

Everything here is the gateway's record (console.core.gateway_wire.RolloutRecord): names,
whys and details are outside text, and the screen shows this Text through SafeStatic (the
TUI's one sanitizer). A figure the record does not have is "?", never 0; the figures are
p95s over the step's verification windows (console.gateway.failover.verify), and say where they
were read from. Beside the step under way's baseline goes the figure after its turn, else
the latest the console read of it (its engine's metrics or the gateway's measures, a p95,
never a mean), else "?". Each model's capacity is the gateway's, read with the record.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.text import Text

from console.core.gateway_wire import ModelCapacity, capacity_head
from console.tui import format as fmt

if TYPE_CHECKING:
    from console.collect.views.view import FleetView

OPEN = ("running", "paused", "halted", "interrupted")
STATUS_STYLE = {
    "running": "bold cyan",
    "paused": "bold yellow",
    "halted": "bold white on red",
    "interrupted": "bold black on yellow",
    "succeeded": "bold green",
    "aborted": "bold yellow",
}
STEP_STYLE = {
    "pending": "dim",
    "running": "bold cyan",
    "done": "green",
    "halted": "bold red",
    "interrupted": "bold yellow",
    "aborted": "yellow",
}
MAX_ROWS = 24  # steps listed around the one under way; the rest are counted
MAX_WAVE_NAMES = 6  # a wave with more steps is counted by state
MAX_WAVES = 12
MAX_EVENTS = 8
MAX_OTHERS = 5
MAX_BESIDE = 8  # steps of the wave under way detailed (its models go side by side)
MAX_MODELS = 8  # models whose capacity is listed; those below what the plan keeps first


def chosen(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rollout the screen is about: the newest open one, else the newest."""
    return next((r for r in records if r.get("status") in OPEN), records[0] if records else None)


def at_step(record: dict[str, Any]) -> dict[str, Any] | None:
    """The step under way (or next); None when every step is done."""
    steps = record.get("steps") or []
    current = int(record.get("current") or 0)
    return steps[current] if current < len(steps) else None


def label(record: dict[str, Any]) -> str:
    """The rollout as a confirmation names it: `restart, step 2 of 4: tiny-b`."""
    steps = record.get("steps") or []
    step = at_step(record)
    where = (
        f"step {int(record.get('current') or 0) + 1} of {len(steps)}: {step['deployment']}"
        if step is not None
        else f"all {len(steps)} steps done"
    )
    return f"{record.get('operation')}, {where}"


def steer_refusal(record: dict[str, Any], verb: str) -> str | None:
    """Why `verb` (pause, resume, abort) makes no sense for this rollout now; None if it
    may be asked (the gateway still decides)."""
    status, rid = record.get("status"), record.get("id")
    asked = bool(record.get("pause_asked"))
    if verb == "pause" and (status != "running" or asked):
        return f"rollout {rid} is {status}{' (a pause is asked)' if asked else ''}: no pause"
    if verb == "resume" and status not in ("paused", "halted", "interrupted") and not asked:
        return f"rollout {rid} is {status}: nothing to resume"
    if verb == "abort" and status not in OPEN:
        return f"rollout {rid} has ended ({status}): nothing to abort"
    return None


# A step's figures, as the screen names them (the record's keys are not words).
FIGURES = (("baseline", "baseline, serving"), ("canary_baseline", "baseline, canaries"),
           ("verified", "after its operation"), ("served", "serving again"))  # fmt: skip


def figure(step: dict[str, Any], key: str) -> str:
    """`baseline→after` for one p95, each pair as the rollout compared them: TTFT of the
    canaries before its turn → after its operation; ITL serving before → serving again
    after the restore. Unknown is "?"."""
    if key == "ttft_p95_s":
        before = (step.get("canary_baseline") or step.get("baseline") or {}).get(key)
        after = (step.get("verified") or {}).get(key)
    else:
        before = (step.get("baseline") or {}).get(key)
        after = (step.get("served") or {}).get(key)
    return f"{fmt.seconds(before)}→{fmt.seconds(after)}"


def _ago(when: float | None, now: float | None = None) -> str:
    """`when` as a clock time and how long before `now` (a replay's cursor; else now)."""
    if not when:
        return "?"
    clock = time.strftime("%H:%M:%S", time.localtime(when))
    return f"{clock} ({fmt.seconds(max(0.0, (now or time.time()) - when))} ago)"


def _weights(weights: Any) -> str:
    if isinstance(weights, dict):
        return " ".join(f"{d}={w}" for d, w in weights.items()) or "none"
    return str(weights)


def head(record: dict[str, Any], now: float | None = None) -> Text:
    """Who started what, where it is, and why it stopped; `now`: a replay's cursor."""
    status = str(record.get("status"))
    steps = record.get("steps") or []
    t = Text()
    t.append(f"rollout {record.get('id')} ", style="bold")
    t.append(f" {status.upper()} ", style=STATUS_STYLE.get(status, "bold"))
    if record.get("pause_asked"):
        t.append(" pause asked (at this wave's end)", style="yellow")
    t.append(f"  {record.get('operation')} of {len(steps)} deployment(s)  by {record.get('who')}")
    t.append(f"\nstarted {_ago(record.get('created'), now)}", style="dim")
    t.append(f"  updated {_ago(record.get('updated'), now)}", style="dim")
    why = (record.get("params") or {}).get("why")
    if why:
        t.append(f"\nwhy: {why}")
    step = at_step(record)
    if step is None:
        t.append(f"\nall {len(steps)} steps done", style="green")
    else:
        n = int(record.get("current") or 0) + 1
        phase = step.get("phase") or ("not started" if step.get("state") == "pending" else "-")
        t.append("\nstep ", style="bold")
        t.append(f"{n} of {len(steps)}, wave {step.get('wave')}: ", style="bold")
        t.append(f"{step.get('deployment')}", style="bold")
        t.append(f" ({step.get('model')} on {step.get('node')})  {step.get('state')}, phase ")
        t.append(str(phase), style="bold")
    if record.get("error"):
        word = {"halted": "HALTED", "interrupted": "INTERRUPTED", "aborted": "ABORTED"}
        t.append(f"\n{word.get(status, 'error')}: ", style="bold red")
        t.append(str(record["error"]), style="red")
    if step is not None and step.get("breach"):
        t.append("\nbreach: ", style="bold red")
        t.append(str(step["breach"]))
    for model, weights in (record.get("weights_seen") or {}).items():
        t.append(f"\n{model}: weights read back from its data plane: ", style="bold")
        t.append(_weights(weights))
    return t


def waves(record: dict[str, Any]) -> Text:
    """One line per wave: its deployments and their states (counted in a big wave)."""
    by_wave: dict[int, list[dict[str, Any]]] = {}
    for step in record.get("steps") or []:
        by_wave.setdefault(int(step.get("wave") or 0), []).append(step)
    t = Text("waves", style="bold")
    for n, (wave, steps) in enumerate(sorted(by_wave.items())):
        if n == MAX_WAVES:
            t.append(f"\n  ... {len(by_wave) - MAX_WAVES} more waves", style="dim")
            break
        canary = " canary" if any(s.get("canary") for s in steps) else ""
        t.append(f"\n  {wave:>3}{canary}: ")
        if len(steps) > MAX_WAVE_NAMES:
            counts: dict[str, int] = {}
            for s in steps:
                counts[str(s.get("state"))] = counts.get(str(s.get("state")), 0) + 1
            for state, count in counts.items():
                t.append(f"{count} {state}  ", style=STEP_STYLE.get(state, ""))
            continue
        for s in steps:
            t.append(f"{s.get('deployment')} ")
            t.append(f"{s.get('state')}  ", style=STEP_STYLE.get(str(s.get("state")), ""))
    return t


# Widths with the one space after each; DEPLOYMENT takes what is left at 80 columns.
COLUMNS = (("#", 4), ("DEPLOYMENT", 16), ("NODE", 10), ("STATE", 12), ("PHASE", 10),
           ("TTFT p95", 13), ("ITL p95", 12))  # fmt: skip


def steps_table(record: dict[str, Any]) -> Text:
    """Each deployment's state and phase, its TTFT and ITL p95 before its turn (the
    baseline) → what its verification read after; each step under way marked ▶ (a wave's
    models go side by side)."""
    steps = record.get("steps") or []
    current = int(record.get("current") or 0)
    first = max(0, min(current - MAX_ROWS // 2, len(steps) - MAX_ROWS))
    shown = steps[first : first + MAX_ROWS]
    t = Text()
    for name, width in COLUMNS:
        t.append(f"{name:<{width}}", style="bold")
    t.append("\n" + " " * sum(w for _, w in COLUMNS[:5]) + "before→after", style="dim")
    if first:
        t.append(f"\n  ... {first} steps before", style="dim")
    for i, step in enumerate(shown, first):
        state = str(step.get("state"))
        under_way = (i == current and state != "done") or state == "running"
        mark = "▶" if under_way else " "
        cells = (
            f"{mark}{i + 1}", str(step.get("deployment")), str(step.get("node")), state,
            str(step.get("phase") or ""), figure(step, "ttft_p95_s"), figure(step, "itl_p95_s"),
        )  # fmt: skip
        t.append("\n")
        for (name, width), cell in zip(COLUMNS, cells, strict=True):
            style = STEP_STYLE.get(state, "") if name in ("STATE", "#") else ""
            fitted = fmt.fit(cell, width, style)
            t.append_text(fitted)
            t.append(" " * max(0, width - fitted.cell_len))
    after = len(steps) - first - len(shown)
    if after > 0:
        t.append(f"\n  ... {after} steps after", style="dim")
    return t


def details(record: dict[str, Any], view: FleetView | None = None) -> Text:
    """The step under way (or the last), and beside it its wave's other steps under way or
    stopped (a wave's models go side by side): each phase by phase, its p95s beside its
    baseline (`now_lines`), and where its figures came from."""
    steps = record.get("steps") or []
    if not steps:
        return Text()
    current = min(int(record.get("current") or 0), len(steps) - 1)
    wave = steps[current].get("wave")
    beside = [n for n, s in enumerate(steps) if n != current and s.get("wave") == wave
              and s.get("state") not in ("done", "pending")]  # fmt: skip
    shown = [current, *beside[: MAX_BESIDE - 1]]
    t = Text("\n\n").join(step_block(n, steps[n], view) for n in shown)
    if len(beside) > MAX_BESIDE - 1:
        t.append(f"\n\n... {len(beside) - MAX_BESIDE + 1} more steps of wave {wave} under way",
                 style="dim")  # fmt: skip
    return t


def step_block(n: int, step: dict[str, Any], view: FleetView | None) -> Text:
    """One step: each phase done in a line, the one under way, its p95s beside their
    baselines, where its figures came from."""
    t = Text(f"step {n + 1}: {step.get('deployment')}", style="bold")
    for phase, line in (step.get("details") or {}).items():
        t.append(f"\n  {phase:<10}", style="bold")
        t.append(str(line))
    if step.get("phase"):
        t.append(f"\n  {step['phase']:<10}", style="bold")
        t.append("under way" if step.get("state") == "running" else f"{step.get('state')} here")
    if step.get("state") not in ("done", "pending"):
        t.append_text(now_lines(step, live_figures(view, step)))
    for name, label in FIGURES:
        source = (step.get(name) or {}).get("source")
        if source:
            t.append(f"\n  {label}: figures from {source}", style="dim")
    return t


def capacity(record: dict[str, Any]) -> Text:
    """Each model's capacity now (the gateway's, read with the record): those below what
    the plan keeps first, then the unknown ones. Unknown is "?" with why, never 0."""
    caps = record.get("capacity")
    t = Text(capacity_head(caps), style="bold" if caps is not None else "yellow")
    if caps is None:
        return t
    found = [(model, ModelCapacity.model_validate(cap or {})) for model, cap in caps.items()]
    order = sorted(found, key=lambda mc: (not mc[1].below, mc[1].ready is not None))
    for model, cap in order[:MAX_MODELS]:
        style = "bold red" if cap.below else "yellow" if cap.ready is None else ""
        t.append(f"\n  {model}: ", style="bold")
        t.append(cap.words(), style=style)
    if len(order) > MAX_MODELS:
        t.append(f"\n  ... {len(order) - MAX_MODELS} more models", style="dim")
    return t


def live_figures(view: FleetView | None, step: dict[str, Any] | None) -> dict[str, Any]:
    """The latest TTFT and ITL p95 the console read of the step's deployment, each with
    where from: its engine's metrics (a histogram's p95; a mean is no p95), else the
    gateway's measures; {} where the console has no row for it."""
    if view is None or step is None:
        return {}
    rows = view.models.get(str(step.get("model")), [])
    row = next((r for r in rows if r.id == step.get("deployment")), None)
    if row is None:
        return {}
    lat = row.stats.latency if row.stats is not None else None
    window = row.stats.window_s if row.stats is not None else None
    over = f", over {fmt.seconds(window)}" if window else ""
    found: dict[str, Any] = {}
    for key, name in (("ttft_p95_s", "ttft_s"), ("itl_p95_s", "itl_s")):
        engine = getattr(lat, name) if lat is not None else None
        gateway = getattr(row.gateway, name) if row.gateway is not None else None
        if engine is not None and engine.p95 is not None:
            found[key] = (engine.p95, f"its engine's metrics{over}")
        elif gateway is not None and gateway.p95 is not None:
            found[key] = (gateway.p95, "the gateway's measures of its traffic")
        elif engine is not None and engine.mean is not None:
            found[key] = (None, "its engine gives only a mean, no p95")
    return found


# Each p95 beside its baseline: the baselines it is held to, and the figure after its turn.
NOW = (("ttft_p95_s", "TTFT p95", ("canary_baseline", "baseline"), "verified"),
       ("itl_p95_s", "ITL p95", ("baseline",), "served"))  # fmt: skip


def now_lines(step: dict[str, Any], live: dict[str, Any]) -> Text:
    """Each p95 beside its baseline: after its turn when measured, else the console's
    latest reading of it (`live_figures`) with where from, else "?"."""
    words = dict(FIGURES)
    t = Text()
    for key, name, bases, after_key in NOW:
        base = next((b for b in bases if (step.get(b) or {}).get(key) is not None), None)
        t.append(f"\n  {name:<10}", style="bold")
        t.append(f"baseline {fmt.seconds((step.get(base) or {}).get(key) if base else None)}")
        if base is not None:
            t.append(f" ({words[base]})", style="dim")
        after = (step.get(after_key) or {}).get(key)
        if after is not None:
            value, source = after, words[after_key]
        else:
            value, source = live.get(key, (None, "not measured since its baseline"))
            source = f"latest: {source}" if value is not None else source
        t.append(f"  now {fmt.seconds(value)}", style="bold")
        t.append(f" ({source})", style="dim")
    return t


def events(record: dict[str, Any]) -> Text:
    """The last events, oldest first: when, who, what, why."""
    t = Text("events", style="bold")
    found = record.get("events") or []
    if not found:
        t.append(": none recorded", style="dim")
    for event in found[-MAX_EVENTS:]:
        when = time.strftime("%H:%M:%S", time.localtime(event.get("time") or 0))
        t.append(f"\n  {when} {event.get('who')} ")
        t.append(str(event.get("what")), style="bold")
        if event.get("why"):
            t.append(f": {event['why']}")
    return t


def others(records: list[dict[str, Any]], shown: dict[str, Any]) -> Text:
    """The gateway's other rollouts, newest first."""
    rest = [r for r in records if r is not shown][:MAX_OTHERS]
    t = Text()
    if not rest:
        return t
    t.append("other rollouts", style="bold")
    for r in rest:
        steps = r.get("steps") or []
        at = f"{min(int(r.get('current') or 0) + 1, len(steps))}/{len(steps)}"
        when = time.strftime("%m-%d %H:%M", time.localtime(r.get("created") or 0))
        t.append(f"\n  {r.get('id')} ")
        t.append(f"{r.get('status')!s:<12}", style=STATUS_STYLE.get(str(r.get("status")), ""))
        t.append(f"{r.get('operation')!s:<10} step {at:<7} {when} by {r.get('who')}")
    return t


def keys_line(record: dict[str, Any], refused: str | None) -> Text:
    """What the operator may do with it now, or why nothing (read-only, a viewer token)."""
    if refused:
        return Text(refused, style="yellow")
    can = [
        (key, what)
        for key, verb, what in (("p", "pause", "pause at this wave's end"),
                                ("r", "resume", "resume"), ("A", "abort", "abort now"))
        if steer_refusal(record, verb) is None
    ]  # fmt: skip
    if not can:
        return Text(f"it has ended ({record.get('status')}): nothing to steer", style="dim")
    t = Text()
    for key, what in can:
        t.append(f" {key} ", style="reverse")
        t.append(f" {what}   ")
    return t


def rollout_text(
    records: list[dict[str, Any]],
    refused: str | None = None,
    view: FleetView | None = None,
    now: float | None = None,
) -> Text:
    """The whole screen's text: the chosen rollout, then the others; `view`: the console's
    last view, for the step under way's latest figures; `now`: a replay's cursor time (the
    "ago"s count from it)."""
    record = chosen(records)
    if record is None:
        return Text(
            "no rollout in the gateway: engineroom rollout plan ..., then rollout run PLAN",
            style="dim",
        )
    parts = [head(record, now), keys_line(record, refused), capacity(record), waves(record),
             steps_table(record), details(record, view), events(record),
             others(records, record)]  # fmt: skip
    return Text("\n\n").join(p for p in parts if p.plain)
