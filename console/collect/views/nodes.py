"""A node's line in the Fleet table and its GPUs summed up for it: the parts of the view
(console/collect/views/view.py) made of one node's snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from console.collect.sources.collector import NodeStatus
from console.core.snapshot import GPUS_NOT_READ, Engine, Gpu, Snapshot


@dataclass(slots=True)
class NodeRow:
    """A node's line in the Fleet table. It is the same object from one view to the next
    while nothing in it changed, so a screen can keep what it made of it; its snapshot's
    age is the node state's (NodeState.age)."""

    name: str
    status: NodeStatus
    transport: str
    error: str | None
    gpus: int | None
    util_avg: float | None
    util_max: float | None
    mem_used: int | None
    mem_total: int | None
    temp_max: float | None
    engines: str
    alerts: int
    gpu_status: str | None


@dataclass(slots=True)
class GpuCell:
    node: str
    node_status: NodeStatus
    gpu: Gpu


@dataclass(slots=True)
class GpuNumbers:
    """A node's GPUs summed up for its row, from its last snapshot."""

    gpus: int | None = None
    util_sum: float = 0.0
    util_count: int = 0
    util_max: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    temp_max: float | None = None

    @classmethod
    def of(cls, snap: Snapshot | None) -> GpuNumbers:
        out = cls()
        if snap is None:
            return out
        # Not read yet (Prometheus' first read): how many is unknown, not 0.
        out.gpus = None if snap.gpu_status == GPUS_NOT_READ else len(snap.gpus)
        for g in snap.gpus:
            if (util := g.utilization_pct) is not None:
                out.util_sum += util
                out.util_count += 1
                out.util_max = util if out.util_max is None else max(out.util_max, util)
            if (temp := g.temperature_c) is not None:
                out.temp_max = temp if out.temp_max is None else max(out.temp_max, temp)
            if g.memory_used_bytes is not None:
                out.mem_used = (out.mem_used or 0) + g.memory_used_bytes
            if g.memory_total_bytes is not None:
                out.mem_total = (out.mem_total or 0) + g.memory_total_bytes
        return out


def engine_summary(engines: list[Engine]) -> str:
    """ "vllm 0.32.0 x3, triton 2.51.0": which engine versions run here, at a glance."""
    counts: dict[str, int] = {}
    for e in engines:
        label = f"{e.kind} {e.version or '?'}"
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{label} x{n}" if n > 1 else label for label, n in counts.items())
