"""What `engineroom diagnose` prints (its verb: console/commands/diagnose.py): one look at
the fleet's diagnoses over SSH, as text, Markdown or JSON (console.collect.diagnose.diagnoser finds
them; check.poll_once reads the fleet).

Exit codes as `check`'s: 0 nothing found and every node seen, 1 a diagnosis (or a node not
seen), 2 no node answered. Every name and figure came from outside: text goes through
console.core.safetext on its way out.
"""

from __future__ import annotations

import json

from console.collect.diagnose.diagnoser import Diagnosis
from console.collect.sources.source import SourceHealth
from console.collect.views.check import Diagnosed, status_of
from console.collect.views.view import FleetView
from console.core import diagnosis as d
from console.core.config.model import Fleet
from console.core.safetext import for_markdown_cell, for_terminal


def _age(seconds: float | None) -> str:
    return "age ?" if seconds is None else f"{seconds:.0f} s old"


def _blind_line(view: FleetView) -> str | None:
    s = view.summary
    if s.unseen:
        return f"CANNOT SEE {s.unseen} OF {s.nodes} NODES: nothing is diagnosed there"
    return None


def render_text(
    view: FleetView, found: Diagnosed, source: SourceHealth | None, fleet: Fleet
) -> str:
    s = view.summary
    lines = [f"fleet {s.name}  {status_of(view, source, found).upper()}  "
             f"diagnoses {len(found.found)}"]  # fmt: skip
    if (blind := _blind_line(view)) is not None:
        lines.insert(0, blind)
    if not found.found:
        lines.append("no diagnosis: nothing the classes in docs/diagnoses.md look for")
    for n, x in enumerate(found.found, 1):
        lines += ["", f"{n}. {x.kind.severity.upper()} {x.headline()}", f"   {x.kind.summary}"]
        for e in x.evidence:
            lines.append(f"   - {e.figure}: {e.value}  ({e.at}, {_age(e.age_s)})")
        lines.append(f"   rules it out: {x.kind.rules_out}")
        for k, move in enumerate(x.moves, 1):
            lines.append(f"   move {k}: {d.MOVE_TEXT[move]}{move_hint(fleet, x, move)}")
    if found.cannot_tell:
        lines += ["", "CANNOT TELL"] + [f"  {c.line()}" for c in found.cannot_tell]
    return "\n".join(map(for_terminal, lines))


def move_hint(fleet: Fleet, x: Diagnosis, move: d.Move) -> str:
    """Where the move is made: the console's key, or the command line's verb."""
    if move == "failover" and x.model:
        return f"  (engineroom failover {x.model} --plan; in the console: :diag, Enter)"
    if move == "quarantine" and x.model and x.deployment:
        return f"  (engineroom failover {x.model} --drain {x.deployment} --plan)"
    if move in ("restart", "stop") and x.engine and x.node:
        return f"  (engineroom vllm {move} --node {x.node} --engine {x.engine})"
    if move == "start" and x.profile and x.node:
        return f"  (engineroom vllm start --node {x.node} --profile {x.profile})"
    if move == "escalate" and x.node:
        return f"  (on {x.node}: {' ; '.join(d.escalation_commands(fleet, x.node))})"
    return ""


def render_markdown(view: FleetView, found: Diagnosed) -> str:
    out = [f"# Diagnoses: {for_markdown_cell(view.summary.name)}", ""]
    if (blind := _blind_line(view)) is not None:
        out += [f"**{blind}**", ""]
    out += ["| severity | diagnosis | subject | evidence | first move |", "|---|---|---|---|---|"]
    for x in found.found:
        evidence = "; ".join(f"{e.figure} {e.value} ({e.at})" for e in x.evidence)
        cells = [x.kind.severity, x.kind.title + (f" ({x.cause})" if x.cause else ""),
                 x.subject, evidence, d.MOVE_TEXT[x.moves[0]]]  # fmt: skip
        out.append("| " + " | ".join(for_markdown_cell(c) for c in cells) + " |")
    for c in found.cannot_tell:
        out.append(f"- cannot tell: {for_markdown_cell(c.line())}")
    return "\n".join(out)


def render(
    fmt: str, view: FleetView, found: Diagnosed, source: SourceHealth | None, fleet: Fleet
) -> str:
    if fmt == "json":
        return json.dumps(
            {"fleet": view.summary.name, "status": status_of(view, source, found),
             "nodes_unseen": view.summary.unseen, **found.as_dict()},
            indent=2,
        )  # fmt: skip
    if fmt == "markdown":
        return render_markdown(view, found)
    return render_text(view, found, source, fleet)
