"""A model's figures read from Prometheus, made into the snapshot's `ModelStats`.

Two sources give them: the engine's own series (Prometheus scrapes the engine; the
queries in console.collect.prometheus.promql tag each figure) and the agent's (`engineroom_model_*`,
named after the snapshot's fields). Both are checked against their bounds
(console.collect.prometheus.check) first: a refused figure is unknown, never 0.
"""

from __future__ import annotations

from typing import Any, cast

from console.collect.prometheus.check import Notes, Reading, checked, model_bounds, shown
from console.collect.prometheus.promql import AGENT_STATS, WAITING
from console.core.metrics.readings import capped_reasons
from console.core.plugin import PromSeries
from console.core.snapshot import Latency, ModelStats, Percentiles

FIGURES = ("ttft", "itl", "e2e")


def engine_model(
    name: str, readings: dict[str, Reading], ps: PromSeries, window_s: float, notes: Notes
) -> ModelStats:
    """A model from its engine's own series."""
    r = checked(readings, model_bounds, notes, f"model {shown(name)}")
    requests, errors = r.get("requests"), r.get("errors")
    latency = {}
    for figure in FIGURES:
        if figure in ps.histograms and f"{figure}.count" in r:
            latency[f"{figure}_s"] = Percentiles(
                p50=r.get(f"{figure}.p50"),
                p95=r.get(f"{figure}.p95"),
                p99=r.get(f"{figure}.p99"),
                mean=r.get(f"{figure}.mean"),
                count=r.get(f"{figure}.count"),
                source="histogram",
            )
        elif f"mean:{figure}" in r or f"count:{figure}" in r:
            latency[f"{figure}_s"] = Percentiles(
                mean=r.get(f"mean:{figure}"),
                count=r.get(f"count:{figure}"),
                source="mean",
            )
    stats = _stats(name, r, latency)
    stats.request_rate = requests
    stats.error_rate = min(1.0, errors / requests) if requests and errors is not None else None
    stats.window_s = window_s
    return stats


def agent_model(name: str, readings: dict[str, Reading], notes: Notes) -> ModelStats:
    """A model from the agent's own series (Prometheus scrapes the agent, not the engine)."""
    r = checked(readings, model_bounds, notes, f"model {shown(name)}")
    latency = {}
    for figure in FIGURES:
        stats: dict[str, Any] = {
            s: r.get(f"{figure}.{s}") for s in AGENT_STATS if f"{figure}.{s}" in r
        }
        if stats:
            histogram = any(k != "mean" for k in stats)
            latency[f"{figure}_s"] = Percentiles(
                **stats, source="histogram" if histogram else "mean"
            )
    made = _stats(name, r, latency)
    made.request_rate, made.error_rate = r.get("request_rate"), r.get("error_rate")
    return made


def _stats(name: str, r: dict[str, float | None], latency: dict[str, Percentiles]) -> ModelStats:
    """What both sources name alike: the gauges, and the figures the diagnoses read."""
    return ModelStats(
        name=name,
        requests_running=r.get("requests_running"),
        requests_waiting=r.get("requests_waiting"),
        kv_cache_usage=r.get("kv_cache_usage"),
        generation_tokens_rate=r.get("generation_tokens_rate"),
        preemption_rate=r.get("preemption_rate"),
        generation_stalled_s=r.get("generation_stalled_s"),
        completion_stalled_s=r.get("completion_stalled_s"),
        prefix_cache_hit_rate=r.get("prefix_cache_hit_rate"),
        requests_waiting_by_reason=_by_reason(r),
        latency=Latency(**latency),
    )


def _by_reason(readings: dict[str, float | None]) -> dict[str, float] | None:
    """The waiting requests by reason among a model's checked readings; None when the
    source has none, or when one of them was refused (the split is then not known)."""
    found = {k[len(WAITING) :]: v for k, v in readings.items() if k.startswith(WAITING)}
    if not found or any(v is None for v in found.values()):
        return None
    return capped_reasons(cast(dict[str, float], found))
