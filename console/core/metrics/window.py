"""Windowed rates and percentiles from successive cumulative readings.

Percentiles come from histogram bucket deltas between the newest reading and the one at
the start of the window, never from counts since the engine started. Where an engine
only exposes cumulative totals, the window gives their mean and says so. A counter that
went backwards means the engine restarted: the window starts again from that reading.
"""

from __future__ import annotations

import math
from collections import deque

from console.core.metrics.readings import LATENCIES, Histogram, MeanCounter, ModelReading
from console.core.wire import Latency, ModelStats, Percentiles

# The span of the rates that name a storm as it starts (preemptions): the last 10 s of the
# window, not all of it.
RECENT_S = 10.0


def quantile(q: float, bounds: tuple[float, ...], cumulative: tuple[float, ...]) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated inside its bucket.

    Follows Prometheus' histogram_quantile: a rank that falls in the +Inf bucket gives
    the highest finite bound. None when the histogram is empty.
    """
    if not cumulative or cumulative[-1] <= 0:
        return None
    rank = q * cumulative[-1]
    for i, count in enumerate(cumulative):
        if count >= rank:
            lower = bounds[i - 1] if i > 0 else 0.0
            upper = bounds[i]
            if math.isinf(upper):
                return lower
            below = cumulative[i - 1] if i > 0 else 0.0
            inside = count - below
            if inside <= 0:
                return upper
            return lower + (upper - lower) * (rank - below) / inside
    return None


def _delta_histogram(new: Histogram, old: Histogram | None) -> Histogram | None:
    if old is None:
        return None
    if old.bounds != new.bounds:
        return None
    counts = tuple(n - o for n, o in zip(new.counts, old.counts, strict=True))
    return Histogram(new.bounds, counts, new.sum - old.sum, new.count - old.count)


def _went_backwards(new: ModelReading, old: ModelReading) -> bool:
    for key, value in new.counters.items():
        if key in old.counters and value < old.counters[key]:
            return True
    for key, hist in new.histograms.items():
        prev = old.histograms.get(key)
        if prev is not None and (hist.count < prev.count or hist.bounds != prev.bounds):
            return True
    for key, mean in new.means.items():
        prev_mean = old.means.get(key)
        if prev_mean is not None and mean.count < prev_mean.count:
            return True
    return False


def _inside(reading: ModelReading) -> bool:
    """Requests running or waiting in this reading."""
    return (reading.requests_running or 0) + (reading.requests_waiting or 0) > 0


class ModelWindow:
    """The readings of one model on one engine over the last `window_s` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._readings: deque[tuple[float, ModelReading]] = deque()

    def add(self, t: float, reading: ModelReading) -> None:
        if self._readings and _went_backwards(reading, self._readings[-1][1]):
            self._readings.clear()
        self._readings.append((t, reading))
        # The window spans from its oldest reading that is not older than window_s.
        while len(self._readings) >= 2 and self._readings[0][0] < t - self.window_s:
            self._readings.popleft()

    def stats(self) -> ModelStats:
        t_new, new = self._readings[-1]
        stats = ModelStats(
            name=new.name,
            requests_running=new.requests_running,
            requests_waiting=new.requests_waiting,
            kv_cache_usage=new.kv_cache_usage,
            requests_waiting_by_reason=None
            if new.waiting_by_reason is None
            else dict(new.waiting_by_reason),
        )
        if len(self._readings) < 2:
            return stats  # one reading: no rate or percentile is known yet
        t_old, old = self._readings[0]
        span = t_new - t_old
        stats.window_s = round(span, 3)

        def delta(key: str) -> float | None:
            if key in new.counters and key in old.counters:
                return new.counters[key] - old.counters[key]
            return None

        requests, errors = delta("requests"), delta("errors")
        if requests is not None and span > 0:
            stats.request_rate = requests / span
            if errors is not None and requests > 0:
                stats.error_rate = min(1.0, errors / requests)
        for key, attr in (
            ("prompt_tokens", "prompt_tokens_rate"),
            ("generation_tokens", "generation_tokens_rate"),
        ):
            value = delta(key)
            if value is not None and span > 0:
                setattr(stats, attr, value / span)
        stats.preemption_rate = self._recent_rate("preemptions")
        stats.generation_stalled_s = self._stalled_s("generation_tokens")
        stats.completion_stalled_s = self._stalled_s("requests")
        hits, queries = delta("prefix_cache_hits"), delta("prefix_cache_queries")
        if hits is not None and queries is not None and queries > 0:  # never 0/0
            stats.prefix_cache_hit_rate = min(1.0, hits / queries)
        stats.latency = Latency(
            **{f"{name}_s": self._percentiles(name, new, old) for name in LATENCIES}
        )
        return stats

    def _recent_rate(self, counter: str) -> float | None:
        """`counter`'s rate over the last RECENT_S of the window (all of it when it is
        shorter): a storm of preemptions is named within seconds of its start, not once
        it has filled a minute's average."""
        t_new, new = self._readings[-1]
        base = self._readings[0]
        for t, reading in reversed(self._readings):
            if t <= t_new - RECENT_S:
                base = (t, reading)
                break
        t_old, old = base
        if counter not in new.counters or counter not in old.counters or t_new <= t_old:
            return None
        return (new.counters[counter] - old.counters[counter]) / (t_new - t_old)

    def _stalled_s(self, counter: str) -> float | None:
        """Seconds that requests have been in (running or waiting) with `counter` flat:
        back to the newest reading where it rose or nothing was in, as far as the window
        sees. 0 with nothing in now. An engine that was idle and just got a request has
        stalled one scrape at most, not its whole idle time. None where the engine does not
        export the counter: an engine that does not count is never said to stall.
        "generation_tokens": no token generated (a wedged engine); "requests": no request
        finished (a stalled Triton model)."""
        readings = self._readings
        t_new, new = readings[-1]
        if counter not in new.counters:
            return None
        for i in range(len(readings) - 1, 0, -1):
            t, reading = readings[i]
            now = reading.counters.get(counter)
            before = readings[i - 1][1].counters.get(counter)
            if now is None or before is None or now > before or not _inside(reading):
                return round(t_new - t, 3)
        return round(t_new - readings[0][0], 3)

    @staticmethod
    def _percentiles(name: str, new: ModelReading, old: ModelReading) -> Percentiles:
        hist = new.histograms.get(name)
        if hist is not None:
            d = _delta_histogram(hist, old.histograms.get(name))
            if d is not None:
                return Percentiles(
                    p50=quantile(0.50, d.bounds, d.counts),
                    p95=quantile(0.95, d.bounds, d.counts),
                    p99=quantile(0.99, d.bounds, d.counts),
                    mean=d.sum / d.count if d.count > 0 else None,
                    count=d.count,
                    source="histogram",
                )
        mean = new.means.get(name)
        if mean is not None:
            prev: MeanCounter | None = old.means.get(name)
            if prev is not None:
                count = mean.count - prev.count
                return Percentiles(
                    mean=(mean.total_s - prev.total_s) / count if count > 0 else None,
                    count=count,
                    source="mean",
                )
        return Percentiles()
