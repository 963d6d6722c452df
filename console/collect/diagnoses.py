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

import bisect
import math
import time
from dataclasses import dataclass
from typing import Any

from console.collect.deployments import DeploymentRow
from console.collect.measured import gateway_measure, gateway_p95
from console.collect.source import NodeState
from console.collect.view import FleetView
from console.core import diagnosis as d
from console.core.config import Fleet
from console.core.diagnosis import CannotTell, Diagnosis, Evidence
from console.core.snapshot import Engine, Job, ModelStats, Snapshot
from console.core.units import duration_from_seconds

VERIFY_S = 120.0  # after a move, how long the condition may take to go
RESOLVED_SHOWN_S = 300.0  # how long a resolved diagnosis stays listed
# A replica slower than its siblings by less than this is noise, whatever the ratio (a
# 12 ms TTFT beside 5 ms ones is no incident).
IMBALANCE_FLOOR_S = 0.05
# An exit older than this in a snapshot is no reading (the agent keeps an hour's).
EXITS_SANE_S = 7 * 86400.0
_OPEN = ("queued", "running")
_STARTS = ("vllm.start", "engine.restart")


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
        self.cannot_tell: list[CannotTell] = []
        self.looks = 0

    def moved(self, key: tuple[str, str], move: d.Move, now: float | None = None) -> None:
        """An operator made `move` for the diagnosis `key`: verify it from now on."""
        self.moves[key] = _Move(move, time.time() if now is None else now)

    def update(
        self,
        view: FleetView,
        states: dict[str, NodeState],
        gateway: dict[str, Any] | None = None,
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
            if key not in current and key not in self.moves:
                del self.first_seen[key]
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
        return sorted(out, key=_order)


def _busy_engines(states: dict[str, NodeState]) -> set[tuple[str | None, str]]:
    """(node, engine) of every engine with a job under way."""
    out: set[tuple[str | None, str]] = set()
    for name, state in states.items():
        if state.snapshot is not None:
            jobs = state.snapshot.jobs
            out |= {(name, e) for j in jobs if j.state in _OPEN and (e := _job_engine(j))}
    return out


def _order(x: Diagnosis) -> tuple[int, int, str]:
    return (x.state == "resolved", x.kind.severity != "critical", x.subject)


def _holds(x: Diagnosis) -> str:
    return "; ".join(f"{e.figure} {e.value}" for e in x.evidence[:3])


def diagnose_once(
    fleet: Fleet,
    view: FleetView,
    states: dict[str, NodeState],
    gateway: dict[str, Any] | None = None,
) -> tuple[list[Diagnosis], list[CannotTell]]:
    """One look, as `engineroom diagnose` and `check` take it."""
    diagnoser = Diagnoser(fleet)
    return diagnoser.update(view, states, gateway), diagnoser.cannot_tell


# -- finding ---------------------------------------------------------------------------


@dataclass
class _Node:
    name: str
    snap: Snapshot
    age: float | None
    busy: set[str]  # engines with a job under way

    def at(self, engine: Engine) -> str:
        return f"engine {engine.id} on {self.name}"


def find(
    fleet: Fleet,
    view: FleetView,
    states: dict[str, NodeState],
    gateway: dict[str, Any] | None,
    now: float,
) -> tuple[list[Diagnosis], list[CannotTell]]:
    found: list[Diagnosis] = []
    blind: list[CannotTell] = []
    nodes: dict[str, _Node] = {}
    seen = {row.name: row.status for row in view.nodes}
    for name, state in states.items():
        snap = state.snapshot
        if snap is None or seen.get(name) not in ("up", "stale"):
            continue  # a node not seen: the view says so first; nothing is guessed
        busy = {e for j in snap.jobs if j.state in _OPEN and (e := _job_engine(j))}
        nodes[name] = _Node(name, snap, state.age(), busy)
    declared = _declared_models(fleet)
    for node in nodes.values():
        for engine in node.snap.engines:
            if engine.id not in node.busy:
                found += _crash_loop(fleet, node, engine, now)
            if engine.state != "ready" or engine.id in node.busy:
                continue  # loading, stopping, restarting, in a drill: expected work
            for stats in engine.models:
                model = _model_of(declared, engine, stats)
                if engine.kind == "triton":
                    found += _triton_stall(fleet, node, engine, stats, model, blind)
                else:
                    found += _engine_wedged(fleet, node, engine, stats, model, blind)
                found += _kv_pressure(fleet, node, engine, stats, model, blind)
        found += _failed_starts(node)
        found += _slow_starts(fleet, node)
        found += _gpu_faults(node)
        found += _throttled(fleet, node, declared, blind)
    for model, rows in view.models.items():
        live = [r for r in rows if not r.standby and r.weight != 0 and r.state == "ready"]
        for row in live:
            where = nodes.get(row.node)
            if where is None or (row.engine_id and row.engine_id in where.busy):
                continue
            measure = gateway_measure(gateway, model, row.id)
            found += _saturated(fleet, where, model, row, measure, blind)
            found += _error_burst(fleet, where, model, row, measure)
        found += _imbalance(fleet, nodes, model, live)
        for row in rows:
            if row.trt is not None and row.trt.state == "stale" and row.node in nodes:
                found.append(_stale(nodes[row.node], model, row))
    return found, blind


_DECLARED: dict[int, tuple[Fleet, dict[tuple[str, str], str]]] = {}


def _declared_models(fleet: Fleet) -> dict[tuple[str, str], str]:
    """{(deployment id, the model name its engine reports): the declared model}: a Triton
    deployment's engine reports its `engine_model` ("ensemble"), not the model's name.
    Made once per fleet (20,000 deployments at 10,000 nodes)."""
    kept = _DECLARED.get(id(fleet))
    if kept is not None and kept[0] is fleet:
        return kept[1]
    found = {}
    for model in fleet.models:
        for dep in model.deployments:
            for reported in {model.name, dep.engine_model or model.name}:
                found[(dep.id, reported)] = model.name
    _DECLARED.clear()  # one fleet at a time (a console, a check)
    _DECLARED[id(fleet)] = (fleet, found)
    return found


def _model_of(declared: dict[tuple[str, str], str], engine: Engine, stats: ModelStats) -> str:
    """The declared model whose figures `stats` are; the reported name where none is."""
    for dep in engine.deployment_ids:
        if (model := declared.get((dep, stats.name))) is not None:
            return model
    return stats.name


def _job_engine(job: Job) -> str | None:
    engine = job.result.get("engine_id") or job.params.get("engine")
    return engine if isinstance(engine, str) else None


def _num(value: float | None, unit: str = "") -> str:
    return "?" if value is None else f"{value:g}{unit}"


def _engine_wedged(
    fleet: Fleet, node: _Node, engine: Engine, m: ModelStats, model: str, blind: list[CannotTell]
) -> list[Diagnosis]:
    if m.requests_running is None and m.requests_waiting is None:
        return []
    inside = (m.requests_running or 0) + (m.requests_waiting or 0)
    if inside <= 0:
        return []
    subject = f"{node.name}/{engine.id}"
    if m.generation_stalled_s is None:
        blind.append(CannotTell(d.ENGINE_WEDGED.name, subject, "a generated-token counter"))
        return []
    after = d.limit(fleet, model, "wedged_after_s")
    if m.generation_stalled_s < after:
        return []
    at = node.at(engine)
    evidence = [
        Evidence(
            "no token generated for", duration_from_seconds(m.generation_stalled_s), at, node.age
        ),
        Evidence("requests running", _num(m.requests_running), at, node.age),
        Evidence("requests waiting", _num(m.requests_waiting), at, node.age),
        Evidence(
            "health", f"{engine.state}, answered in {_num(engine.probe_ms, ' ms')}", at, node.age
        ),
    ]
    return [
        Diagnosis(
            d.ENGINE_WEDGED,
            subject,
            node.name,
            evidence,
            model=model,
            deployment=",".join(engine.deployment_ids) or None,
            engine=engine.id,
        )
    ]


def _crash_loop(fleet: Fleet, node: _Node, engine: Engine, now: float) -> list[Diagnosis]:
    """Exits of the engine's process that no one asked for (the agent's watch: a stop or
    restart job's are not among them): one it is not back from, or crash_loop_exits within
    crash_loop_window_s (an outside supervisor starting it again each time)."""
    # Times an agent sent: only those that can be (a hostile one's 1e308 is none).
    exits = [t for t in engine.exits if math.isfinite(t) and now - EXITS_SANE_S <= t <= now + 60]
    if not exits:
        return []
    model = _deployment_model(fleet, engine)
    window = d.limit(fleet, model, "crash_loop_window_s")
    recent = [t for t in exits if t >= now - window]
    # Down with its process known: the process that exited unasked is the one it had (an
    # engine the agent stopped has none), however long ago. Only a declared deployment's:
    # an engine the fleet does not serve from may come and go (someone's trial vLLM).
    down = engine.state == "down" and engine.pid is not None and bool(engine.deployment_ids)
    looping = len(recent) >= d.limit(fleet, model, "crash_loop_exits")
    if not (down or looping):
        return []
    at = node.at(engine)
    shown = recent or exits[-1:]
    ago = ", ".join(duration_from_seconds(max(0.0, now - t)) for t in reversed(shown[-5:]))
    evidence = [
        Evidence(
            f"exits no one asked for in {duration_from_seconds(window)}",
            f"{len(recent)} ({ago} ago)",
            at,
            node.age,
        ),
        Evidence("state", f"{engine.state}: {engine.reason or 'no reason given'}", at, node.age),
    ]
    return [
        Diagnosis(
            d.CRASH_LOOP,
            f"{node.name}/{engine.id}",
            node.name,
            evidence,
            model=model,
            deployment=",".join(engine.deployment_ids) or None,
            engine=engine.id,
            cause=f"exited {len(recent)} times" if looping else "exited, not back",
        )
    ]


def _deployment_model(fleet: Fleet, engine: Engine) -> str | None:
    """The declared model of the engine's first deployment (its thresholds)."""
    for model in fleet.models:
        if any(dep.id in engine.deployment_ids for dep in model.deployments):
            return model.name
    return None


def _triton_stall(
    fleet: Fleet, node: _Node, engine: Engine, m: ModelStats, model: str, blind: list[CannotTell]
) -> list[Diagnosis]:
    """Triton counts no tokens, but it counts finished requests: requests queued (pending)
    with that count flat. A model whose instances all block leaves the rest pending."""
    if not m.requests_waiting:  # None (unknown) or 0: nothing queued
        return []
    subject = f"{node.name}/{engine.id}"
    if m.completion_stalled_s is None:
        blind.append(CannotTell(d.TRITON_STALL.name, subject, "a finished-request counter"))
        return []
    after = d.limit(fleet, model, "triton_stall_after_s")
    if m.completion_stalled_s < after:
        return []
    at = node.at(engine)
    evidence = [
        Evidence(
            "no request finished for", duration_from_seconds(m.completion_stalled_s), at, node.age
        ),
        Evidence("requests pending", _num(m.requests_waiting), at, node.age),
        Evidence("requests running", _num(m.requests_running), at, node.age),
        Evidence(
            "health", f"{engine.state}, answered in {_num(engine.probe_ms, ' ms')}", at, node.age
        ),
    ]
    return [
        Diagnosis(
            d.TRITON_STALL,
            subject,
            node.name,
            evidence,
            model=model,
            deployment=",".join(engine.deployment_ids) or None,
            engine=engine.id,
        )
    ]


def _kv_pressure(
    fleet: Fleet, node: _Node, engine: Engine, m: ModelStats, model: str, blind: list[CannotTell]
) -> list[Diagnosis]:
    usage = m.kv_cache_usage
    if usage is None or usage < d.limit(fleet, model, "kv_pressure_usage"):
        return []
    capacity = (m.requests_waiting_by_reason or {}).get("capacity")
    subject = f"{node.name}/{engine.id}"
    if m.preemption_rate is None and capacity is None:
        blind.append(CannotTell(d.KV_PRESSURE.name, subject, "preemptions or waiting by reason"))
        return []
    if not ((m.preemption_rate or 0) > 0 or (capacity or 0) > 0):
        return []
    at = node.at(engine)
    evidence = [
        Evidence("KV cache", f"{usage:.0%}", at, node.age),
        Evidence(
            "preemptions",
            _num(m.preemption_rate and round(m.preemption_rate, 2), "/s"),
            at,
            node.age,
        ),
        Evidence("waiting for capacity", _num(capacity), at, node.age),
    ]
    return [
        Diagnosis(
            d.KV_PRESSURE,
            subject,
            node.name,
            evidence,
            model=model,
            deployment=",".join(engine.deployment_ids) or None,
            engine=engine.id,
        )
    ]


def _failed_starts(node: _Node) -> list[Diagnosis]:
    """A failed start whose engine no later start brought up (jobs come newest first)."""
    out: list[Diagnosis] = []
    started: set[str] = set()
    for job in sorted(node.snap.jobs, key=lambda j: j.created or 0, reverse=True):
        engine = _job_engine(job)
        if job.kind not in _STARTS or engine is None:
            continue
        if job.state == "succeeded" or job.state in _OPEN:
            started.add(engine)
        elif job.state == "failed" and engine not in started:
            started.add(engine)  # only its newest failure
            tail = job.result.get("log_tail")
            text = " ".join([job.error or "", *(tail if isinstance(tail, list) else [])])
            at = f"job {job.id} on {node.name}"
            evidence = [Evidence("error", (job.error or "?")[:200], at, _since(job.updated))]
            out.append(
                Diagnosis(
                    d.START_FAILED,
                    f"{node.name}/{engine}",
                    node.name,
                    evidence,
                    engine=engine,
                    cause=d.start_cause(text),
                )
            )
    return out


def _since(t: float | None) -> float | None:
    return None if t is None else max(0.0, time.time() - t)


def _slow_starts(fleet: Fleet, node: _Node) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    for job in node.snap.jobs:
        profile = fleet.profiles.get(str(job.params.get("profile")))
        cold = job.result.get("cold_start")
        if job.kind != "vllm.start" or job.state != "succeeded" or profile is None:
            continue
        if not isinstance(cold, dict):
            continue
        budget, total = profile.cold_start_budget_s, cold.get("total_s")
        if budget is None or not isinstance(total, (int, float)) or total <= budget:
            continue
        phase, took = _slowest_phase(cold.get("phases") or {}, total)
        at = f"job {job.id} on {node.name}"
        age = _since(job.updated)
        evidence = [
            Evidence("cold start", f"{total:.1f} s over its {budget:g} s budget", at, age),
            Evidence("slowest phase", f"{phase} ({took:.1f} s)", at, age),
        ]
        out.append(
            Diagnosis(
                d.SLOW_COLD_START,
                f"{node.name}/{_job_engine(job)}",
                node.name,
                evidence,
                engine=_job_engine(job),
                cause=phase,
            )
        )
    return out


def _slowest_phase(phases: dict[str, Any], total: float) -> tuple[str, float]:
    """The phase that took longest: each phase's mark is seconds from the spawn."""
    marks = sorted((v, k) for k, v in phases.items() if isinstance(v, (int, float)))
    best, before = ("ready", 0.0), 0.0
    for at, name in [*marks, (total, "ready")]:
        if at - before > best[1]:
            best = (name, at - before)
        before = max(before, at)
    return best


def _gpu_faults(node: _Node) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    for gpu in node.snap.gpus:
        at = f"GPU {gpu.index} on {node.name}"
        evidence: list[Evidence] = []
        kinds: list[str] = []
        for event in gpu.xid_events[-3:]:
            kind, what = d.xid_class(event.xid)
            kinds.append(kind)
            evidence.append(Evidence(f"XID {event.xid}", f"{kind}: {what}", at, _since(event.time)))
        if gpu.ecc_uncorrected:
            kinds.append("memory")
            evidence.append(Evidence("uncorrected ECC", str(gpu.ecc_uncorrected), at, node.age))
        remap = gpu.remapped_rows or {}
        if remap.get("failure") or remap.get("pending"):
            kinds.append("memory")
            state = "failed" if remap.get("failure") else "pending"
            evidence.append(Evidence("row remapping", state, at, node.age))
        if lost := [e for e in gpu.errors if "GPU is lost" in e]:  # NVML_ERROR_GPU_IS_LOST
            kinds.insert(0, "hardware")  # off the bus: before anything read from it earlier
            evidence.insert(0, Evidence("NVML", lost[0], at, node.age))
        if not evidence:
            continue
        out.append(
            Diagnosis(
                d.GPU_FAULT,
                f"{node.name}/gpu{gpu.index}",
                node.name,
                evidence,
                cause=kinds[0],
            )
        )
    had = len(node.snap.gpus) + len(node.snap.gpus_gone)
    for gone in node.snap.gpus_gone:
        index = "?" if gone.index is None else gone.index
        at = f"NVML on {node.name}"
        evidence = [
            Evidence("GPUs listed", f"{len(node.snap.gpus)} of the {had} the node had", at,
                     node.age),
            Evidence(f"not listed: GPU {index}", f"{gone.name or 'a GPU'} {gone.uuid}", at,
                     _since(gone.last_seen)),
        ]  # fmt: skip
        out.append(
            Diagnosis(
                # By UUID: NVML numbers the GPUs it lists anew, so its old index may be
                # another GPU's now.
                d.GPU_FAULT,
                f"{node.name}/{gone.uuid}",
                node.name,
                evidence,
                cause="hardware",
            )
        )
    return out


def _throttled(
    fleet: Fleet, node: _Node, declared: dict[tuple[str, str], str], blind: list[CannotTell]
) -> list[Diagnosis]:
    """A GPU slowed down (its clock-event reasons) under a ready engine whose ITL p95 is
    over its model's SLO: the slowdown is hurting a model, not just showing."""
    out: list[Diagnosis] = []
    engines = {e.id: e for e in node.snap.engines if e.state == "ready" and e.id not in node.busy}
    for gpu in node.snap.gpus:
        slowed = [r for r in gpu.clock_event_reasons or [] if r in d.SLOWDOWNS]
        owners = {p.engine_id for p in gpu.processes or [] if p.engine_id in engines}
        if not slowed or not owners:
            continue
        subject = f"{node.name}/gpu{gpu.index}"
        at = f"GPU {gpu.index} on {node.name}"
        for engine in (engines[e] for e in sorted(o for o in owners if o)):
            for stats in engine.models:
                model = _model_of(declared, engine, stats)
                slo = next((m.slo.itl_p95_ms for m in fleet.models if m.name == model), None)
                itl = stats.latency.itl_s.p95  # a p95, never a mean taken for one
                if slo is None or itl is None:
                    needs = f"an ITL SLO for {model}" if slo is None else "an ITL p95"
                    blind.append(CannotTell(d.THROTTLED_GPU.name, subject, needs))
                    continue
                if itl * 1000 <= slo:
                    continue
                evidence = [
                    Evidence("clock-event reasons", ", ".join(slowed), at, node.age),
                    Evidence("SM clock", _num(gpu.sm_clock_mhz, " MHz"), at, node.age),
                    Evidence("temperature", _num(gpu.temperature_c, " C"), at, node.age),
                    Evidence(
                        "power", f"{_num(gpu.power_w, ' W')} of {_num(gpu.power_limit_w, ' W')}",
                        at, node.age,
                    ),
                    Evidence(
                        f"ITL p95 of {model}", f"{itl * 1000:.1f} ms (SLO {slo:g} ms)",
                        node.at(engine), node.age,
                    ),
                ]  # fmt: skip
                out.append(
                    Diagnosis(
                        d.THROTTLED_GPU,
                        subject,
                        node.name,
                        evidence,
                        model=model,
                        deployment=",".join(engine.deployment_ids) or None,
                        engine=engine.id,
                        cause=next(r for r in d.SLOWDOWNS if r in slowed),
                    )
                )
                break  # one diagnosis per GPU and engine
    return out


def _engine_of(node: _Node, row: DeploymentRow) -> Engine | None:
    return next((e for e in node.snap.engines if e.id == row.engine_id), None)


def _saturated(
    fleet: Fleet,
    node: _Node,
    model: str,
    row: DeploymentRow,
    measure: dict[str, Any] | None,
    blind: list[CannotTell],
) -> list[Diagnosis]:
    engine_p95 = row.stats.latency.ttft_s.p95 if row.stats else None
    client_p95 = gateway_p95(measure, "ttft_s")
    times = d.limit(fleet, model, "saturated_gap_times")
    if engine_p95 is None or client_p95 is None or engine_p95 <= 0:
        return []
    if client_p95 < times * engine_p95:
        return []
    slo = next((m.slo.ttft_p95_ms for m in fleet.models if m.name == model), None)
    if slo is not None and engine_p95 * 1000 > slo:
        return []  # the engine itself is slow: not its API server
    engine = _engine_of(node, row)
    subject = f"{model}/{row.id}"
    cpu = engine.api_server_cpu_pct if engine else None
    if cpu is None:
        blind.append(CannotTell(d.API_SERVER_SATURATED.name, subject, "the API server's CPU"))
        return []
    if cpu < d.limit(fleet, model, "saturated_cpu_pct"):
        return []
    at = f"engine {row.engine_id} on {node.name}"
    evidence = [
        Evidence("TTFT p95 at the gateway", duration_from_seconds(client_p95), "gateway", None),
        Evidence("TTFT p95 at the engine", duration_from_seconds(engine_p95), at, node.age),
        Evidence("API server CPU", f"{cpu:.0f}% of a core", at, node.age),
    ]
    return [
        Diagnosis(
            d.API_SERVER_SATURATED,
            subject,
            node.name,
            evidence,
            model=model,
            deployment=row.id,
            engine=row.engine_id,
        )
    ]


def _error_burst(
    fleet: Fleet, node: _Node, model: str, row: DeploymentRow, measure: dict[str, Any] | None
) -> list[Diagnosis]:
    limit = d.limit(fleet, model, "error_burst_rate")
    rate, at, age = None, "gateway", None
    if measure is not None and isinstance(measure.get("error_rate"), (int, float)):
        rate = float(measure["error_rate"])
    elif row.stats is not None and row.stats.error_rate is not None:
        rate, at, age = row.stats.error_rate, f"engine {row.engine_id} on {node.name}", node.age
    if rate is None or rate < limit:
        return []
    evidence = [Evidence("failed / finished", f"{rate:.1%} (limit {limit:.1%})", at, age)]
    if measure is not None:
        failures, requests = measure.get("failures"), measure.get("requests")
        evidence.append(Evidence("requests", f"{failures} failed of {requests}", "gateway", None))
    return [
        Diagnosis(
            d.ERROR_BURST,
            f"{model}/{row.id}",
            node.name,
            evidence,
            model=model,
            deployment=row.id,
            engine=row.engine_id,
        )
    ]


def _imbalance(
    fleet: Fleet, nodes: dict[str, _Node], model: str, rows: list[DeploymentRow]
) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    times = d.limit(fleet, model, "imbalance_times")
    for figure in ("ttft_s", "itl_s"):
        known = {}
        for r in rows:
            p = getattr(r.stats.latency, figure) if r.stats else None
            if p is not None and p.p95 is not None and p.source == "histogram" and r.id:
                known[r.id] = (r, p.p95)
        ordered = sorted(v for _, v in known.values())
        for rid, (row, p95) in known.items():
            if len(known) < 2 or row.node not in nodes:
                continue
            median = _median_without(ordered, p95)
            if median <= 0 or p95 < times * median or p95 - median < IMBALANCE_FLOOR_S:
                continue
            node = nodes[row.node]
            name = "TTFT" if figure == "ttft_s" else "ITL"
            evidence = [
                Evidence(
                    f"{name} p95",
                    duration_from_seconds(p95),
                    f"engine {row.engine_id} on {node.name}",
                    node.age,
                ),
                Evidence(
                    f"siblings' {name} p95 median",
                    duration_from_seconds(median),
                    f"{len(known) - 1} other deployments",
                    None,
                ),
            ]
            out.append(
                Diagnosis(
                    d.REPLICA_IMBALANCE,
                    f"{model}/{rid}",
                    node.name,
                    evidence,
                    model=model,
                    deployment=rid,
                    engine=row.engine_id,
                )
            )
    unique = {x.subject: x for x in out}  # TTFT and ITL both: said once
    return list(unique.values())


def _median_without(ordered: list[float], value: float) -> float:
    """The median of sorted `ordered` less one `value`: O(log n) a deployment, not O(n)."""
    i, n = bisect.bisect_left(ordered, value), len(ordered) - 1
    middle = [ordered[k if k < i else k + 1] for k in {(n - 1) // 2, n // 2}]
    return sum(middle) / len(middle)


def _stale(node: _Node, model: str, row: DeploymentRow) -> Diagnosis:
    assert row.trt is not None
    at = f"agent on {node.name}"
    evidence = [Evidence("build", reason, at, node.age) for reason in row.trt.reasons[:4]]
    return Diagnosis(
        d.STALE_TRT,
        f"{model}/{row.id}",
        node.name,
        evidence or [Evidence("build", "stale", at, node.age)],
        model=model,
        deployment=row.id,
        engine=row.engine_id,
    )
