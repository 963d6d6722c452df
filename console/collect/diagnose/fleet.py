"""The diagnoses of GPUs and deployments, one finder per class (console/collect/
diagnose/diagnoser.py runs them): GPU fault, throttled GPU, API server saturated, error burst,
replica imbalance, stale TensorRT-LLM engine."""

from __future__ import annotations

import bisect

from console.collect.diagnose.engines import Node, model_of, num, since
from console.collect.views.deployments import DeploymentRow
from console.collect.views.gateway_view import GatewayDeployment
from console.core import diagnosis as d
from console.core.config.load import Fleet
from console.core.diagnosis import CannotTell, Diagnosis, Evidence
from console.core.snapshot import Engine
from console.core.units import duration_from_seconds

# A replica slower than its siblings by less than this is noise, whatever the ratio (a
# 12 ms TTFT beside 5 ms ones is no incident).
IMBALANCE_FLOOR_S = 0.05
# A p95 over fewer samples than this in the window is no p95 to compare: with 3 requests
# in a 10 s window, the p95 is the slowest of them, and a real vLLM beside one stopped in
# bursts was named the slow one by a single late first token.
IMBALANCE_MIN_SAMPLES = 20


def gpu_faults(node: Node) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    for gpu in node.snap.gpus:
        at = f"GPU {gpu.index} on {node.name}"
        evidence: list[Evidence] = []
        kinds: list[str] = []
        for event in gpu.xid_events[-3:]:
            kind, what = d.xid_class(event.xid)
            kinds.append(kind)
            evidence.append(Evidence(f"XID {event.xid}", f"{kind}: {what}", at, since(event.time)))
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
                     since(gone.last_seen)),
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


def throttled(
    fleet: Fleet, node: Node, declared: dict[tuple[str, str], str], blind: list[CannotTell]
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
                model = model_of(declared, engine, stats)
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
                    Evidence("SM clock", num(gpu.sm_clock_mhz, " MHz"), at, node.age),
                    Evidence("temperature", num(gpu.temperature_c, " C"), at, node.age),
                    Evidence(
                        "power", f"{num(gpu.power_w, ' W')} of {num(gpu.power_limit_w, ' W')}",
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


def _engine_of(node: Node, row: DeploymentRow) -> Engine | None:
    return next((e for e in node.snap.engines if e.id == row.engine_id), None)


def saturated(
    fleet: Fleet,
    node: Node,
    model: str,
    row: DeploymentRow,
    at_gateway: GatewayDeployment | None,
    blind: list[CannotTell],
) -> list[Diagnosis]:
    engine_p95 = row.stats.latency.ttft_s.p95 if row.stats else None
    client_p95 = at_gateway.ttft_p95 if at_gateway is not None else None
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


def error_burst(
    fleet: Fleet, node: Node, model: str, row: DeploymentRow, at_gateway: GatewayDeployment | None
) -> list[Diagnosis]:
    limit = d.limit(fleet, model, "error_burst_rate")
    rate, at, age = None, "gateway", None
    if at_gateway is not None and at_gateway.error_rate is not None:
        rate = at_gateway.error_rate
    elif row.stats is not None and row.stats.error_rate is not None:
        rate, at, age = row.stats.error_rate, f"engine {row.engine_id} on {node.name}", node.age
    if rate is None or rate < limit:
        return []
    evidence = [Evidence("failed / finished", f"{rate:.1%} (limit {limit:.1%})", at, age)]
    if at_gateway is not None:
        failures, requests = at_gateway.failures, at_gateway.requests
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


def imbalance(
    fleet: Fleet, nodes: dict[str, Node], model: str, rows: list[DeploymentRow]
) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    times = d.limit(fleet, model, "imbalance_times")
    for figure in ("ttft_s", "itl_s"):
        known = {}
        for r in rows:
            p = getattr(r.stats.latency, figure) if r.stats else None
            if p is None or p.p95 is None or p.source != "histogram" or not r.id:
                continue
            if p.count is None or p.count >= IMBALANCE_MIN_SAMPLES:
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


def stale(node: Node, model: str, row: DeploymentRow) -> Diagnosis:
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
