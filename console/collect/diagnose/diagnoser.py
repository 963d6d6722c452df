"""The diagnoses: which named problem the fleet has, where, on what evidence, and which
move to make (each class is defined once, in console/core/diagnosis.py).

Headless: it reads the view the console and `check` build (from agents, SSH, Prometheus or
a recording) and the gateway's admin snapshot, and nothing else. `Diagnoser.update` gives
the diagnoses now; after a move (`Diagnoser.moved`) a diagnosis says `verifying`, then
`resolved after N s` once its condition is gone, or `still there` once VERIFY_S passed.

- An unknown figure never raises a diagnosis. Where a class's condition is half there and
  the other half is a figure the engine does not export, the class says "cannot tell:
  needs X" (`Diagnoser.cannot_tell`) instead.
- Expected work raises none: an engine with a job under way (a start, a stop, a restart,
  a drill), a deployment the gateway gives no traffic (a standby, a drain, a quarantine).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from console.collect.diagnose import engines
from console.collect.diagnose import fleet as parts
from console.collect.sources.source import NodeState
from console.collect.views.gateway_view import GatewayView
from console.collect.views.view import FleetView
from console.core import diagnosis as d
from console.core.config.load import Fleet
from console.core.diagnosis import CannotTell, Diagnosis

VERIFY_S = 120.0  # after a move, how long the condition may take to go
# A held condition missed for up to this long keeps its hold: one scrape's figure that dips
# (the API server's CPU is read per agent cycle) does not start a 30 s hold again.
HOLD_GAP_S = 5.0
RESOLVED_SHOWN_S = 300.0  # how long a resolved diagnosis stays listed


@dataclass(slots=True)
class _Move:
    move: d.Move
    at: float
    gone_at: float | None = None


class Diagnoser:
    """The diagnoses of successive views; keeps when each was first seen and the moves."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.first_seen: dict[tuple[str, str], float] = {}
        self.moves: dict[tuple[str, str], _Move] = {}
        self.last: dict[tuple[str, str], Diagnosis] = {}
        self.last_found: dict[tuple[str, str], float] = {}  # when each held one was last found
        self.cannot_tell: list[CannotTell] = []
        self.looks = 0

    def moved(self, key: tuple[str, str], move: d.Move, now: float | None = None) -> None:
        """An operator made `move` for the diagnosis `key`: verify it from now on."""
        self.moves[key] = _Move(move, time.time() if now is None else now)

    def update(
        self,
        view: FleetView,
        states: dict[str, NodeState],
        gateway: GatewayView | None = None,
        now: float | None = None,
    ) -> list[Diagnosis]:
        now = time.time() if now is None else now
        found, blind = find(self.fleet, view, states, gateway, now)
        self.cannot_tell = list(dict.fromkeys(blind))
        current = {x.key: x for x in found}
        for key, was in list(self.moves.items()):
            if key in current and was.gone_at is not None:
                # Back after it was resolved: a new incident, not the old move failing
                # ("still there 188 s after failover" said of a wedge that had cleared).
                del self.moves[key]
                self.first_seen.pop(key, None)
        for key in list(self.first_seen):
            missed = now - self.last_found.get(key, now)
            if (
                key not in current
                and key not in self.moves
                and (key in self.last or missed > HOLD_GAP_S)
            ):
                del self.first_seen[key]  # gone, or missed too long while held
        self.last_found.update((key, now) for key in current)
        first_look, self.looks = self.looks == 0, self.looks + 1
        out: list[Diagnosis] = []
        for key, x in current.items():
            x.since = self.first_seen.setdefault(key, now)
            shown = key in self.moves or key in self.last  # raised at an earlier look
            if not first_look and not shown and now - x.since < x.kind.hold_s:
                continue  # not held long enough yet
            if (move := self.moves.get(key)) is not None:
                took = now - move.at
                x.state = "verifying" if took < VERIFY_S else "still there"
                x.detail = (
                    f"verifying {move.move} ({took:.0f} s)"
                    if took < VERIFY_S
                    else f"still there {took:.0f} s after {move.move}: {_holds(x)}"
                )
            out.append(x)
        busy = _busy_engines(states)
        for key, move in list(self.moves.items()):
            if key in current:
                continue
            last = self.last.get(key)
            if last is not None and last.engine and (last.node, last.engine) in busy:
                # The move's job (a restart) is under way on its engine, which the finder
                # passes over meanwhile: not gone, not yet resolved.
                last.state = "verifying"
                last.detail = f"verifying {move.move} ({now - move.at:.0f} s): its job is under way"
                out.append(last)
                continue
            gone = move.gone_at = move.gone_at or now
            if last is None or now - gone > RESOLVED_SHOWN_S:
                del self.moves[key]
                self.first_seen.pop(key, None)
                continue
            last.state, last.detail = (
                "resolved",
                f"resolved {gone - move.at:.0f} s after {move.move}",
            )
            out.append(last)
        self.last = {x.key: x for x in out}
        # Only what is still held or raised: every path that drops a key drops its first_seen.
        self.last_found = {k: t for k, t in self.last_found.items() if k in self.first_seen}
        return sorted(out, key=_order)


def _busy_engines(states: dict[str, NodeState]) -> set[tuple[str | None, str]]:
    """(node, engine) of every engine with a job under way."""
    out: set[tuple[str | None, str]] = set()
    for name, state in states.items():
        if state.snapshot is not None:
            out |= {(name, e) for e in engines.busy(state.snapshot)}
    return out


def _order(x: Diagnosis) -> tuple[int, int, str]:
    return (x.state == "resolved", x.kind.severity != "critical", x.subject)


def _holds(x: Diagnosis) -> str:
    return "; ".join(f"{e.figure} {e.value}" for e in x.evidence[:3])


def diagnose_once(
    fleet: Fleet,
    view: FleetView,
    states: dict[str, NodeState],
    gateway: GatewayView | None = None,
) -> tuple[list[Diagnosis], list[CannotTell]]:
    """One look, as `engineroom diagnose` and `check` take it."""
    diagnoser = Diagnoser(fleet)
    return diagnoser.update(view, states, gateway), diagnoser.cannot_tell


# -- finding ---------------------------------------------------------------------------


def find(
    fleet: Fleet,
    view: FleetView,
    states: dict[str, NodeState],
    gateway: GatewayView | None,
    now: float,
) -> tuple[list[Diagnosis], list[CannotTell]]:
    found: list[Diagnosis] = []
    blind: list[CannotTell] = []
    nodes: dict[str, engines.Node] = {}
    seen = {row.name: row.status for row in view.nodes}
    for name, state in states.items():
        snap = state.snapshot
        if snap is None or seen.get(name) not in ("up", "stale"):
            continue  # a node not seen: the view says so first; nothing is guessed
        nodes[name] = engines.Node(name, snap, state.age(), engines.busy(snap))
    declared = engines.declared_models(fleet)
    for node in nodes.values():
        for engine in node.snap.engines:
            if engine.id not in node.busy:
                found += engines.crash_loop(fleet, node, engine, now)
            if engine.state != "ready" or engine.id in node.busy:
                continue  # loading, stopping, restarting, in a drill: expected work
            for stats in engine.models:
                model = engines.model_of(declared, engine, stats)
                if engine.kind == "triton":
                    found += engines.triton_stall(fleet, node, engine, stats, model, blind)
                else:
                    found += engines.engine_wedged(fleet, node, engine, stats, model, blind)
                found += engines.kv_pressure(fleet, node, engine, stats, model, blind)
        found += engines.failed_starts(node)
        found += engines.slow_starts(fleet, node)
        found += parts.gpu_faults(node)
        found += parts.throttled(fleet, node, declared, blind)
    for model, rows in view.models.items():
        # The gateway's live weight where it routes the model (a drain, a quarantine or a
        # failover moved it from fleet.toml's): one it gives no traffic is expected work.
        weights = (gateway.weights(model) if gateway is not None else None) or {}
        live = [r for r in rows if not r.standby and weights.get(r.id, r.weight) != 0
                and r.state == "ready"]  # fmt: skip
        for row in live:
            where = nodes.get(row.node)
            if where is None or (row.engine_id and row.engine_id in where.busy):
                continue
            at_gateway = gateway.at(model, row.id) if gateway is not None else None
            found += parts.saturated(fleet, where, model, row, at_gateway, blind)
            found += parts.error_burst(fleet, where, model, row, at_gateway)
        found += parts.imbalance(fleet, nodes, model, live)
        for row in rows:
            if row.trt is not None and row.trt.state == "stale" and row.node in nodes:
                found.append(parts.stale(nodes[row.node], model, row))
    return found, blind
