"""What an engine plugin reads from an engine in one probe, in engine-neutral terms.

Readings are cumulative (counters and histogram buckets since the engine started).
`console.core.metrics.window` turns successive readings into windowed rates and percentiles.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from console.core.metrics.promtext import Exposition, parse_value
from console.core.wire import EngineState

# Latency series every plugin maps its engine's names onto.
LATENCIES = ("ttft", "itl", "e2e")
# Counters: finished requests, failed requests, prompt and generated tokens, preempted
# requests, and the prefix cache's hits and queries (both in tokens, as vLLM counts them).
COUNTERS = (
    "requests",
    "errors",
    "prompt_tokens",
    "generation_tokens",
    "preemptions",
    "prefix_cache_hits",
    "prefix_cache_queries",
)
# Waiting requests by reason: an engine names its reasons (vLLM: capacity, deferred), and
# label values are outside text. A model keeps this many, each name cut to this length;
# the rest are summed under OTHER_REASON, so the counts still add up to the waiting total.
MAX_WAITING_REASONS = 16
MAX_REASON_CHARS = 64
OTHER_REASON = "(other)"


@dataclass(slots=True)
class Histogram:
    """A cumulative histogram: bucket upper bounds (ending in +Inf) and cumulative counts."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float


@dataclass(slots=True)
class MeanCounter:
    """Only a cumulative total and count are known (Triton's default): a mean, no percentiles."""

    total_s: float
    count: float


@dataclass(slots=True)
class ModelReading:
    name: str
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    # reason -> requests waiting for it; None where the engine does not say why
    waiting_by_reason: dict[str, float] | None = None
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    means: dict[str, MeanCounter] = field(default_factory=dict)


@dataclass(slots=True)
class EngineReading:
    state: EngineState
    reason: str | None = None
    version: str | None = None
    models: list[ModelReading] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


def histograms_by(exp: Exposition, name: str, group: str) -> dict[str, Histogram]:
    """Histograms of metric `name` per value of label `group`, merged over other labels.

    Buckets are summed across the other labels (vLLM's `engine` label under data
    parallelism), which is the right way to combine replicas: never average percentiles.
    """
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    bucket_name, sum_name, count_name = f"{name}_bucket", f"{name}_sum", f"{name}_count"
    for s in exp.samples:
        if not s.name.startswith(name):
            continue
        key = s.labels.get(group, "")
        if s.name == bucket_name:
            try:  # a bucket whose bound is not a number costs that bucket, not the engine
                bound = parse_value(s.labels.get("le", "NaN"))
            except ValueError:
                continue
            if not math.isnan(bound):
                buckets[key][bound] += s.value
        elif s.name == sum_name:
            sums[key] += s.value
        elif s.name == count_name:
            counts[key] += s.value
    out = {}
    for key, by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        out[key] = Histogram(
            bounds=bounds,
            counts=tuple(by_bound[b] for b in bounds),
            sum=sums.get(key, 0.0),
            count=counts.get(key, by_bound.get(math.inf, 0.0)),
        )
    return out


def values_by(exp: Exposition, name: str, group: str, **match: str) -> dict[str, float]:
    """Sum of metric `name` per value of label `group`, over samples whose labels match."""
    out: dict[str, float] = defaultdict(float)
    for s in exp.samples:
        if s.name != name:
            continue
        if any(s.labels.get(k) != v for k, v in match.items()):
            continue
        out[s.labels.get(group, "")] += s.value
    return dict(out)


def values_by_pair(exp: Exposition, name: str, group: str, by: str) -> dict[str, dict[str, float]]:
    """Sum of metric `name` per value of label `group`, then per value of label `by`
    (vLLM's waiting requests per model, per reason), over the other labels."""
    out: dict[str, dict[str, float]] = {}
    for s in exp.samples:
        if s.name == name:
            inner = out.setdefault(s.labels.get(group, ""), {})
            key = s.labels.get(by, "")
            inner[key] = inner.get(key, 0.0) + s.value
    return out


def capped_reasons(counts: dict[str, float]) -> dict[str, float]:
    """`counts` (reason -> waiting requests) within MAX_WAITING_REASONS names of at most
    MAX_REASON_CHARS: the first names in order, the rest summed under OTHER_REASON."""
    if len(counts) <= MAX_WAITING_REASONS and all(len(k) <= MAX_REASON_CHARS for k in counts):
        return dict(counts)
    out: dict[str, float] = {}
    for reason in sorted(counts):
        key = reason[:MAX_REASON_CHARS]
        if key not in out and len(out) >= MAX_WAITING_REASONS - 1:
            key = OTHER_REASON
        out[key] = out.get(key, 0.0) + counts[reason]
    return out


# Clock-event ("throttle") reason bits, as NVML defines them (and dcgm-exporter exports as
# DCGM_FI_DEV_CLOCK_THROTTLE_REASONS), in words an SRE reads.
CLOCK_EVENT_REASONS = (
    (0x1, "idle"),
    (0x2, "applications clocks setting"),
    (0x4, "software power cap"),
    (0x8, "hardware slowdown"),
    (0x10, "sync boost"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "hardware power brake"),
    (0x100, "display clock setting"),
)


def decode_clock_event_reasons(mask: int) -> list[str]:
    words = [word for bit, word in CLOCK_EVENT_REASONS if mask & bit]
    unknown = mask & ~sum(bit for bit, _ in CLOCK_EVENT_REASONS)
    if unknown:
        words.append(f"other (0x{unknown:x})")
    return words
