"""A plain-text view of one snapshot, for `agent --once` without --json and the early demo."""

from __future__ import annotations

from console.core.units import gib_from_bytes, ms_from_seconds
from console.core.wire import Percentiles, Snapshot


def _num(value: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "?" if value is None else fmt.format(value) + unit


def _gib(value: int | None) -> str:
    return gib_from_bytes(value, decimals=1, unit="G")


def _p95(p: Percentiles, q: str = "p95") -> str:
    value = getattr(p, q)
    if value is None and p.source == "mean" and p.mean is not None:
        return f"~{ms_from_seconds(p.mean, sep='')}(mean)"
    return ms_from_seconds(value, sep="")


def summarize(snap: Snapshot) -> str:
    h = snap.host
    lines = [
        f"node {snap.node.name}  agent {snap.node.agent_version}  "
        f"cpu {_num(h.cpu_pct, unit='%')}  load {_num(h.load1, '{:.2f}')}  "
        f"mem {_gib(h.mem_used_bytes)}/{_gib(h.mem_total_bytes)}",
        f"gpus: {snap.gpu_status}  driver {snap.driver_version or '?'}  "
        f"cuda {snap.cuda_driver_version or '?'}",
    ]
    for g in snap.gpus:
        procs = ", ".join(f"{p.pid}->{p.engine_id or '?'}" for p in g.processes or [])
        lines.append(
            f"  gpu{g.index} {g.name or '?'}  util {_num(g.utilization_pct, unit='%')}  "
            f"mem {_gib(g.memory_used_bytes)}/{_gib(g.memory_total_bytes)}  "
            f"{_num(g.temperature_c, unit='C')}  {_num(g.power_w, unit='W')}"
            f"/{_num(g.power_limit_w, unit='W')}  {procs}"
        )
    for e in snap.engines:
        lines.append(
            f"engine {e.id} {e.kind} {e.version or '?'} {e.state.upper()}"
            + (f"  ({e.reason})" if e.reason else "")
        )
        for m in e.models:
            lat = m.latency
            lines.append(
                f"  model {m.name}  run {_num(m.requests_running)} wait "
                f"{_num(m.requests_waiting)}  kv {_num(m.kv_cache_usage, '{:.0%}')}  "
                f"rate {_num(m.request_rate, '{:.2f}', '/s')}  ttft p95 {_p95(lat.ttft_s)}  "
                f"itl p95 {_p95(lat.itl_s)}  e2e p95 {_p95(lat.e2e_s)}"
            )
    return "\n".join(lines)
