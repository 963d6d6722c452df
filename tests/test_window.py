"""Windowed percentiles and rates: from bucket deltas, never from totals since start."""

from __future__ import annotations

import math

import pytest

from console.core.metrics.readings import Histogram, MeanCounter, ModelReading
from console.core.metrics.window import ModelWindow, quantile

BOUNDS = (0.1, 0.5, 1.0, math.inf)


def reading(counts, requests, errors=0.0, mean=None) -> ModelReading:
    hist = Histogram(BOUNDS, tuple(counts), sum=0.3 * counts[-1], count=counts[-1])
    model = ModelReading(
        "m",
        requests_running=2.0,
        counters={"requests": requests, "errors": errors},
        histograms={"ttft": hist},
    )
    if mean is not None:
        model.means["e2e"] = MeanCounter(*mean)
    return model


def test_quantile_interpolates_inside_the_bucket_like_prometheus():
    assert quantile(0.5, BOUNDS, (0, 10, 10, 10)) == pytest.approx(0.3)
    assert quantile(0.95, BOUNDS, (10, 10, 20, 20)) == pytest.approx(0.95)
    assert quantile(0.99, BOUNDS, (0, 0, 0, 5)) == 1.0  # +Inf bucket: highest finite bound
    assert quantile(0.5, BOUNDS, (0, 0, 0, 0)) is None


def test_percentiles_come_from_the_delta_inside_the_window():
    window = ModelWindow(window_s=60)
    # Before the window: 1000 slow requests. They must not weigh on the percentiles now.
    window.add(0.0, reading((0, 0, 0, 1000), requests=1000))
    window.add(100.0, reading((0, 0, 0, 1000), requests=1000))
    window.add(130.0, reading((90, 100, 100, 1100), requests=1100, errors=5))
    stats = window.stats()
    assert stats.window_s == 30.0
    ttft = stats.latency.ttft_s
    assert ttft.source == "histogram"
    assert ttft.count == 100
    assert ttft.p50 == pytest.approx(0.1 * 50 / 90)
    assert ttft.p95 == pytest.approx(0.1 + 0.4 * 5 / 10)
    assert stats.request_rate == pytest.approx(100 / 30)
    assert stats.error_rate == pytest.approx(0.05)
    assert stats.requests_running == 2.0


def test_one_reading_knows_gauges_but_no_rate_or_percentile():
    window = ModelWindow(window_s=60)
    window.add(0.0, reading((1, 1, 1, 1), requests=1))
    stats = window.stats()
    assert stats.requests_running == 2.0
    assert stats.request_rate is None
    assert stats.latency.ttft_s.p95 is None


def test_no_traffic_in_the_window_is_unknown_latency_and_zero_rate():
    window = ModelWindow(window_s=60)
    window.add(0.0, reading((5, 5, 5, 5), requests=5))
    window.add(10.0, reading((5, 5, 5, 5), requests=5))
    stats = window.stats()
    assert stats.request_rate == 0.0
    assert stats.error_rate is None
    assert stats.latency.ttft_s.p95 is None
    assert stats.latency.ttft_s.count == 0


def test_an_engine_restart_starts_the_window_again():
    window = ModelWindow(window_s=60)
    window.add(0.0, reading((50, 50, 50, 50), requests=50))
    window.add(10.0, reading((1, 1, 1, 1), requests=1))  # counters went back: a restart
    assert window.stats().request_rate is None
    window.add(20.0, reading((3, 3, 3, 3), requests=3))
    assert window.stats().request_rate == pytest.approx(0.2)


def test_a_mean_only_engine_says_so():
    window = ModelWindow(window_s=60)
    window.add(0.0, reading((0, 0, 0, 0), requests=0, mean=(10.0, 100)))
    window.add(5.0, reading((0, 0, 0, 0), requests=0, mean=(13.0, 110)))
    e2e = window.stats().latency.e2e_s
    assert e2e.source == "mean"
    assert e2e.mean == pytest.approx(0.3)
    assert e2e.p95 is None
