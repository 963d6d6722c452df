"""Verification figures from an engine's own metrics, for data planes that have none.

A data plane that counts requests but measures no token latency (HAProxy), or measures
nothing per deployment, reads TTFT and ITL from the engine behind the deployment: its
plugin's probe (console.core.plugin), histogram bucket deltas between two readings, the
p95 interpolated as Prometheus does (console.core.metrics.window.quantile). Never an average of
percentiles, and None (unknown) where the engine exposes no histogram.
"""

from __future__ import annotations

import aiohttp

from console.core.config.load import Deployment
from console.core.metrics.readings import Histogram, ModelReading
from console.core.metrics.window import quantile
from console.core.plugin import EngineTarget, ProbeContext, load_plugins

METRICS_MAX_BYTES = 8 * 1024 * 1024


async def read_engine(
    http: aiohttp.ClientSession, model: str, dep: Deployment, timeout: float
) -> ModelReading | None:
    """The engine's reading for the model, or None when it cannot be read."""
    return (await probe_model(http, model, dep, timeout))[0]


async def probe_model(
    http: aiohttp.ClientSession, model: str, dep: Deployment, timeout: float
) -> tuple[ModelReading | None, str]:
    """(the engine's reading for the model, or None; why there is none, in words)."""
    plugin = load_plugins().get(dep.engine)
    if plugin is None:
        return None, f"no engine plugin {dep.engine!r}"
    name = dep.engine_model or model
    target = EngineTarget(dep.id, dep.engine, dep.endpoint, dep.metrics_endpoint, [name])
    reading = await plugin.probe(target, ProbeContext(http, timeout, METRICS_MAX_BYTES))
    found = next((m for m in reading.models if m.name == name), None)
    if found is not None:
        return found, ""
    why = reading.reason or (
        f"the engine is {reading.state}" if reading.state != "ready" else f"no model {name}"
    )
    return None, why


def p95_since(new: ModelReading | None, old: ModelReading | None, latency: str) -> float | None:
    """The p95 of `latency` ("ttft", "itl") over the requests between two readings."""
    if new is None or old is None:
        return None
    a, b = old.histograms.get(latency), new.histograms.get(latency)
    if a is None or b is None or a.bounds != b.bounds or b.count < a.count:
        return None  # no histogram, or the engine restarted in between
    delta = Histogram(b.bounds, tuple(n - o for n, o in zip(b.counts, a.counts, strict=True)), 0, 0)
    return quantile(0.95, delta.bounds, delta.counts)
