"""The diagnoses of engines and their jobs, one finder per class (console/collect/
diagnose/diagnoser.py runs them over each node): engine wedged, Triton stall, crash loop, KV-cache
pressure, start failed, slow cold start; and what every finder shares (the node as the
finder sees it, the declared model of an engine's figures, how a figure is written)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from console.core import diagnosis as d
from console.core.config.load import Fleet
from console.core.diagnosis import CannotTell, Diagnosis, Evidence
from console.core.snapshot import Engine, Job, ModelStats, Snapshot
from console.core.units import duration_from_seconds

# An exit older than this in a snapshot is no reading (the agent keeps an hour's).
EXITS_SANE_S = 7 * 86400.0
OPEN = ("queued", "running")
STARTS = ("vllm.start", "engine.restart")


@dataclass
class Node:
    name: str
    snap: Snapshot
    age: float | None
    busy: set[str]  # engines with a job under way

    def at(self, engine: Engine) -> str:
        return f"engine {engine.id} on {self.name}"


_DECLARED: dict[int, tuple[Fleet, dict[tuple[str, str], str]]] = {}


def declared_models(fleet: Fleet) -> dict[tuple[str, str], str]:
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


def model_of(declared: dict[tuple[str, str], str], engine: Engine, stats: ModelStats) -> str:
    """The declared model whose figures `stats` are; the reported name where none is."""
    for dep in engine.deployment_ids:
        if (model := declared.get((dep, stats.name))) is not None:
            return model
    return stats.name


def busy(snap: Snapshot) -> set[str]:
    """The engines with a job under way (a start, a stop, a restart, a drill)."""
    return {e for j in snap.jobs if j.state in OPEN and (e := job_engine(j))}


def job_engine(job: Job) -> str | None:
    engine = job.result.get("engine_id") or job.params.get("engine")
    return engine if isinstance(engine, str) else None


def num(value: float | None, unit: str = "") -> str:
    return "?" if value is None else f"{value:g}{unit}"


def engine_wedged(
    fleet: Fleet, node: Node, engine: Engine, m: ModelStats, model: str, blind: list[CannotTell]
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
        Evidence("requests running", num(m.requests_running), at, node.age),
        Evidence("requests waiting", num(m.requests_waiting), at, node.age),
        Evidence(
            "health", f"{engine.state}, answered in {num(engine.probe_ms, ' ms')}", at, node.age
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


def crash_loop(fleet: Fleet, node: Node, engine: Engine, now: float) -> list[Diagnosis]:
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


def triton_stall(
    fleet: Fleet, node: Node, engine: Engine, m: ModelStats, model: str, blind: list[CannotTell]
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
        Evidence("requests pending", num(m.requests_waiting), at, node.age),
        Evidence("requests running", num(m.requests_running), at, node.age),
        Evidence(
            "health", f"{engine.state}, answered in {num(engine.probe_ms, ' ms')}", at, node.age
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


def kv_pressure(
    fleet: Fleet, node: Node, engine: Engine, m: ModelStats, model: str, blind: list[CannotTell]
) -> list[Diagnosis]:
    usage, preempting = m.kv_cache_usage, m.preemption_rate
    storm = preempting is not None and preempting >= d.limit(
        fleet, model, "kv_preemption_storm_rate"
    )
    if not storm and (usage is None or usage < d.limit(fleet, model, "kv_pressure_usage")):
        return []
    capacity = (m.requests_waiting_by_reason or {}).get("capacity")
    subject = f"{node.name}/{engine.id}"
    if preempting is None and capacity is None:
        blind.append(CannotTell(d.KV_PRESSURE.name, subject, "preemptions or waiting by reason"))
        return []
    if not ((preempting or 0) > 0 or (capacity or 0) > 0):
        return []
    at = node.at(engine)
    evidence = [
        Evidence("KV cache", "?" if usage is None else f"{usage:.0%}", at, node.age),
        Evidence(
            "preemptions",
            num(m.preemption_rate and round(m.preemption_rate, 2), "/s"),
            at,
            node.age,
        ),
        Evidence("waiting for capacity", num(capacity), at, node.age),
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


def failed_starts(node: Node) -> list[Diagnosis]:
    """A failed start whose engine no later start brought up (jobs come newest first)."""
    out: list[Diagnosis] = []
    started: set[str] = set()
    for job in sorted(node.snap.jobs, key=lambda j: j.created or 0, reverse=True):
        engine = job_engine(job)
        if job.kind not in STARTS or engine is None:
            continue
        if job.state == "succeeded" or job.state in OPEN:
            started.add(engine)
        elif job.state == "failed" and engine not in started:
            started.add(engine)  # only its newest failure
            tail = job.result.get("log_tail")
            text = " ".join([job.error or "", *(tail if isinstance(tail, list) else [])])
            at = f"job {job.id} on {node.name}"
            evidence = [Evidence("error", (job.error or "?")[:200], at, since(job.updated))]
            out.append(
                Diagnosis(
                    d.START_FAILED,
                    f"{node.name}/{engine}",
                    node.name,
                    evidence,
                    engine=engine,
                    cause=d.start_cause(text),
                    profile=_profile(job),
                )
            )
    return out


def _profile(job: Job) -> str | None:
    """The launch profile a start job started (a restart's job names none)."""
    profile = job.params.get("profile")
    return profile if isinstance(profile, str) else None


def since(t: float | None) -> float | None:
    return None if t is None else max(0.0, time.time() - t)


def slow_starts(fleet: Fleet, node: Node) -> list[Diagnosis]:
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
        age = since(job.updated)
        evidence = [
            Evidence("cold start", f"{total:.1f} s over its {budget:g} s budget", at, age),
            Evidence("slowest phase", f"{phase} ({took:.1f} s)", at, age),
        ]
        out.append(
            Diagnosis(
                d.SLOW_COLD_START,
                f"{node.name}/{job_engine(job)}",
                node.name,
                evidence,
                engine=job_engine(job),
                cause=phase,
                profile=_profile(job),
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
