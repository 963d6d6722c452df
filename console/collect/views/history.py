"""Short histories for sparklines and plots, kept cheap for thousand-node fleets.

Each node keeps a ring of frames: one frame per poll, a fixed row of 32-bit floats (NaN
for unknown) holding every series of that node. Recording a poll is one slice
assignment, not one Python call per value, and 1,000 nodes of 8 GPUs with 120 points
cost about 15 MB.
"""

from __future__ import annotations

import math
from array import array

from console.core.snapshot import Snapshot

NAN = float("nan")
GPU_SERIES = ("util", "mem_pct", "temp", "power")
MODEL_SERIES = ("ttft_p95", "itl_p95", "e2e_p95", "waiting")


class Series:
    """One column of a Frames ring, read oldest first; None where unknown."""

    __slots__ = ("_column", "_frames")

    def __init__(self, frames: Frames, column: int) -> None:
        self._frames = frames
        self._column = column

    def values(self) -> list[float | None]:
        return self._frames.column(self._column)

    def tail(self, n: int) -> list[float | None]:
        """The newest `n` values, oldest first (cheap: alerts read this every refresh)."""
        return self._frames.column(self._column, last=n)


class Frames:
    __slots__ = ("_count", "_data", "_next", "size", "width")

    def __init__(self, width: int, size: int) -> None:
        self.width = width
        self.size = size
        self._data = array("f", [NAN]) * (width * size)
        self._next = 0
        self._count = 0

    def push(self, values: list[float]) -> None:
        start = self._next * self.width
        self._data[start : start + self.width] = array("f", values)
        self._next = (self._next + 1) % self.size
        if self._count < self.size:
            self._count += 1

    def column(self, column: int, last: int | None = None) -> list[float | None]:
        count = self._count if last is None else min(last, self._count)
        first = (self._next - count) % self.size
        out: list[float | None] = []
        for i in range(count):
            v = self._data[((first + i) % self.size) * self.width + column]
            out.append(None if math.isnan(v) else v)
        return out


def _f(value: float | None) -> float:
    return NAN if value is None else value


class _NodeHistory:
    __slots__ = ("gpu_frames", "gpu_index", "model_frames", "model_index")

    def __init__(self) -> None:
        self.gpu_index: tuple[int, ...] = ()
        self.gpu_frames: Frames | None = None
        self.model_index: tuple[tuple[str, str], ...] = ()
        self.model_frames: Frames | None = None


class History:
    def __init__(self, size: int = 120) -> None:
        self.size = size
        self._nodes: dict[str, _NodeHistory] = {}

    def record(self, node: str, snap: Snapshot) -> None:
        h = self._nodes.get(node)
        if h is None:
            h = self._nodes[node] = _NodeHistory()
        gpu_index = tuple(g.index for g in snap.gpus)
        if gpu_index != h.gpu_index or h.gpu_frames is None:
            # A different set of GPUs: the old history no longer lines up.
            h.gpu_index = gpu_index
            h.gpu_frames = Frames(len(gpu_index) * len(GPU_SERIES) or 1, self.size)
        values: list[float] = []
        for g in snap.gpus:
            used, total = g.memory_used_bytes, g.memory_total_bytes
            values += (
                NAN if g.utilization_pct is None else g.utilization_pct,
                100.0 * used / total if used is not None and total else NAN,
                NAN if g.temperature_c is None else g.temperature_c,
                NAN if g.power_w is None else g.power_w,
            )
        h.gpu_frames.push(values or [NAN])
        model_index = tuple((e.id, m.name) for e in snap.engines for m in e.models)
        if model_index != h.model_index or h.model_frames is None:
            h.model_index = model_index
            h.model_frames = Frames(len(model_index) * len(MODEL_SERIES) or 1, self.size)
        values = []
        for e in snap.engines:
            for m in e.models:
                lat = m.latency
                values += (
                    _f(lat.ttft_s.p95_or_mean),
                    _f(lat.itl_s.p95_or_mean),
                    _f(lat.e2e_s.p95_or_mean),
                    _f(m.requests_waiting),
                )
        h.model_frames.push(values or [NAN])

    def gpu(self, node: str, index: int) -> dict[str, Series] | None:
        h = self._nodes.get(node)
        if h is None or h.gpu_frames is None or index not in h.gpu_index:
            return None
        base = h.gpu_index.index(index) * len(GPU_SERIES)
        return {name: Series(h.gpu_frames, base + i) for i, name in enumerate(GPU_SERIES)}

    def deployment(self, node: str, engine_id: str, model: str) -> dict[str, Series] | None:
        h = self._nodes.get(node)
        key = (engine_id, model)
        if h is None or h.model_frames is None or key not in h.model_index:
            return None
        base = h.model_index.index(key) * len(MODEL_SERIES)
        return {name: Series(h.model_frames, base + i) for i, name in enumerate(MODEL_SERIES)}
