"""What the gateway measures per deployment, the way clients feel it: TTFT (request in to
first byte of the answer out), inter-chunk latency, end-to-end time and errors.

Two views of the same samples: windowed percentiles (the last `window_s`, for the admin
snapshot, the console and the failover's verification windows), and cumulative
Prometheus histograms for `/metrics`.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from dataclasses import dataclass, field

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MAX_SAMPLES = 20_000  # per series and window: bounded memory under any load


@dataclass
class Series:
    """One latency series: windowed samples and a cumulative histogram."""

    window_s: float
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def add(self, value: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.samples.append((now, value))
        if len(self.samples) > MAX_SAMPLES:
            self.samples.popleft()
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value
        self.n += 1

    def window(self, since: float | None = None) -> list[float]:
        now = time.monotonic()
        cutoff = now - self.window_s if since is None else since
        while self.samples and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        return sorted(v for t, v in self.samples if t >= cutoff)

    def percentiles(self, since: float | None = None) -> dict[str, float | int | None]:
        values = self.window(since)
        if not values:
            return {"p50": None, "p95": None, "p99": None, "count": 0}
        return {
            "p50": _pct(values, 0.50),
            "p95": _pct(values, 0.95),
            "p99": _pct(values, 0.99),
            "count": len(values),
        }


def _pct(values: list[float], q: float) -> float:
    return nearest_rank(values, q)


def nearest_rank(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted `ordered` by nearest rank: the ceil(q n)-th smallest. (The
    index int(q n) was one rank high: the p95 of 20 samples was their slowest.)"""
    rank = max(1, math.ceil(q * len(ordered) - 1e-9))
    return ordered[min(len(ordered), rank) - 1]


@dataclass
class Outcomes:
    """Requests and failures over the window (a failure: an error answer or a cut stream)."""

    window_s: float
    events: deque[tuple[float, bool]] = field(default_factory=deque)
    ok_total: int = 0
    failed_total: int = 0

    def add(self, ok: bool) -> None:
        now = time.monotonic()
        self.events.append((now, ok))
        if len(self.events) > MAX_SAMPLES:
            self.events.popleft()
        if ok:
            self.ok_total += 1
        else:
            self.failed_total += 1

    def rate(self, since: float | None = None) -> tuple[int, int]:
        """(requests, failures) since `since` (default: the window)."""
        now = time.monotonic()
        cutoff = now - self.window_s if since is None else since
        while self.events and self.events[0][0] < now - self.window_s:
            self.events.popleft()
        seen = [ok for t, ok in self.events if t >= cutoff]
        return len(seen), sum(1 for ok in seen if not ok)


@dataclass
class Measures:
    window_s: float
    ttft: Series = field(init=False)
    itl: Series = field(init=False)
    e2e: Series = field(init=False)
    outcomes: Outcomes = field(init=False)

    def __post_init__(self) -> None:
        self.ttft = Series(self.window_s)
        self.itl = Series(self.window_s)
        self.e2e = Series(self.window_s)
        self.outcomes = Outcomes(self.window_s)

    def summary(self, since: float | None = None) -> dict[str, object]:
        requests, failures = self.outcomes.rate(since)
        return {
            "requests": requests,
            "failures": failures,
            "error_rate": None if requests == 0 else failures / requests,
            "ttft_s": self.ttft.percentiles(since),
            "itl_s": self.itl.percentiles(since),
            "e2e_s": self.e2e.percentiles(since),
        }


def exposition(name: str, labels: str, series: Series) -> list[str]:
    """Prometheus histogram lines for one series (cumulative buckets)."""
    lines, running = [], 0
    for bound, count in zip(BUCKETS, series.counts, strict=False):
        running += count
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {running}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {series.n}')
    lines.append(f"{name}_sum{{{labels}}} {series.total:.6f}")
    lines.append(f"{name}_count{{{labels}}} {series.n}")
    return lines
