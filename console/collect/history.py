"""Short histories for sparklines and plots, kept compact for thousand-node fleets.

A series is a fixed ring of 32-bit floats with NaN for "unknown", so 1,000 nodes of 8
GPUs with four series of 120 points cost about 15 MB, not the 120 MB of Python floats.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from console.core.wire import Snapshot

NAN = float("nan")


class Ring:
    __slots__ = ("_count", "_data", "_next")

    def __init__(self, size: int) -> None:
        self._data = array("f", [NAN]) * size
        self._next = 0
        self._count = 0

    def push(self, value: float | None) -> None:
        self._data[self._next] = NAN if value is None else value
        self._next = (self._next + 1) % len(self._data)
        self._count = min(self._count + 1, len(self._data))

    def values(self) -> list[float | None]:
        """Oldest first; None where the value was unknown."""
        size = len(self._data)
        start = (self._next - self._count) % size
        out: list[float | None] = []
        for i in range(self._count):
            v = self._data[(start + i) % size]
            out.append(None if math.isnan(v) else v)
        return out

    def last(self) -> float | None:
        if not self._count:
            return None
        v = self._data[(self._next - 1) % len(self._data)]
        return None if math.isnan(v) else v


GPU_SERIES = ("util", "mem_pct", "temp", "power")
MODEL_SERIES = ("ttft_p95", "itl_p95", "e2e_p95", "waiting")


class History:
    def __init__(self, size: int = 120) -> None:
        self.size = size
        self.gpus: dict[tuple[str, int], dict[str, Ring]] = {}
        self.latency: dict[tuple[str, str, str], dict[str, Ring]] = {}

    def _rings(
        self, table: dict[Any, dict[str, Ring]], key: Any, names: tuple[str, ...]
    ) -> dict[str, Ring]:
        rings = table.get(key)
        if rings is None:
            rings = table[key] = {n: Ring(self.size) for n in names}
        return rings

    def record(self, node: str, snap: Snapshot) -> None:
        for gpu in snap.gpus:
            rings = self._rings(self.gpus, (node, gpu.index), GPU_SERIES)
            rings["util"].push(gpu.utilization_pct)
            mem = None
            if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
                mem = 100.0 * gpu.memory_used_bytes / gpu.memory_total_bytes
            rings["mem_pct"].push(mem)
            rings["temp"].push(gpu.temperature_c)
            rings["power"].push(gpu.power_w)
        for engine in snap.engines:
            for model in engine.models:
                rings = self._rings(self.latency, (node, engine.id, model.name), MODEL_SERIES)
                lat = model.latency
                rings["ttft_p95"].push(
                    lat.ttft_s.p95 if lat.ttft_s.p95 is not None else lat.ttft_s.mean
                )
                rings["itl_p95"].push(
                    lat.itl_s.p95 if lat.itl_s.p95 is not None else lat.itl_s.mean
                )
                rings["waiting"].push(model.requests_waiting)
                rings["e2e_p95"].push(
                    lat.e2e_s.p95 if lat.e2e_s.p95 is not None else lat.e2e_s.mean
                )

    def gpu(self, node: str, index: int) -> dict[str, Ring] | None:
        return self.gpus.get((node, index))

    def deployment(self, node: str, engine_id: str, model: str) -> dict[str, Ring] | None:
        return self.latency.get((node, engine_id, model))
