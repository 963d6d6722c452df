"""Engine metrics from other versions and engines, read from recorded or constructed texts.

Files named *-style or *-backend under tests/fixtures are constructed from documented
metric names (their headers say so); the others were scraped from the real servers here.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from console.core.metrics.promtext import MetricsGarbage, parse
from console.core.metrics.window import ModelWindow
from plugins.triton import read_models
from plugins.trtllm import prometheus_models
from plugins.vllm import read_metrics

FIXTURES = Path(__file__).parent / "fixtures"


def test_labels_with_escapes_commas_and_braces_parse():
    exp = parse('m{a="x,y",b="q\\"uote}",c="back\\\\slash"} 1.5 1700000000\nn 2\nbad line here\n')
    first = exp.samples[0]
    assert first.labels == {"a": "x,y", "b": 'q"uote}', "c": "back\\slash"}
    assert first.value == 1.5
    assert exp.samples[1].value == 2
    assert exp.bad_lines == 1


def test_special_values():
    exp = parse("a +Inf\nb -Inf\nc NaN\n")
    assert exp.samples[0].value == math.inf
    assert math.isnan(exp.samples[2].value)


def test_a_page_of_garbage_is_reported_not_read_as_empty():
    with pytest.raises(MetricsGarbage):
        parse("<html>\n<body>oops</body>\n")
    assert parse("").samples == []  # an empty page is just empty


def test_older_vllm_names_are_still_read():
    [model] = read_metrics((FIXTURES / "vllm-0.9-style.metrics.txt").read_text(), ["llama-8b"])
    assert model.requests_running == 5  # summed over the data-parallel engines
    assert model.requests_waiting == 1
    assert model.kv_cache_usage == pytest.approx(0.42)  # from gpu_cache_usage_perc
    assert model.counters["requests"] == 100
    assert model.counters["errors"] == 0
    assert set(model.histograms) == {"ttft", "itl", "e2e"}  # itl from time_per_output_token
    ttft = model.histograms["ttft"]
    assert ttft.counts == (0, 40, 90, 100, 100)  # buckets merged across engines, not averaged
    assert ttft.count == 100


def test_triton_with_the_tensorrt_llm_backend():
    text = (FIXTURES / "triton-trtllm-backend.metrics.txt").read_text()
    ensemble, trt = read_models(["ensemble", "tensorrt_llm"], {}, text)
    assert trt.requests_waiting == 4  # nv_trt_llm_request_metrics{request_type="waiting"}
    assert trt.requests_running == 12  # {request_type="scheduled"}
    assert trt.kv_cache_usage == 0.625
    assert ensemble.requests_waiting == 0  # nv_inference_pending_request_count
    assert ensemble.kv_cache_usage is None  # unknown, never 0: nothing says what it runs on
    configs = {
        "ensemble": {
            "ensemble_scheduling": {
                "step": [
                    {"model_name": "preprocessing"},
                    {"model_name": "tensorrt_llm"},
                    {"model_name": "postprocessing"},
                ]
            }
        }
    }
    [ens] = read_models(["ensemble"], {}, text, configs=configs)
    # The ensemble's load is its TensorRT-LLM step's: running, waiting and KV come through.
    assert (ens.requests_running, ens.requests_waiting, ens.kv_cache_usage) == (12, 4, 0.625)
    hist = ensemble.histograms["ttft"]  # histogram_latencies=true: milliseconds to seconds
    assert hist.bounds == (0.1, 0.5, 2.0, math.inf)
    assert hist.count == 1200


def test_triton_statistics_give_windowed_means():
    stats = {
        "model_stats": [
            {
                "name": "ensemble",
                "inference_stats": {
                    "success": {"count": 10, "ns": 5_000_000_000},
                    "fail": {"count": 1, "ns": 0},
                    "queue": {"count": 10, "ns": 100_000_000},
                },
                "response_stats": {
                    "0": {"success": {"count": 10, "ns": 400_000_000}},
                    "1": {"success": {"count": 10, "ns": 200_000_000}},
                    "2": {"success": {"count": 10, "ns": 200_000_000}},
                },
            }
        ]
    }
    [model] = read_models(["ensemble"], stats, None)
    assert model.counters == {"requests": 11, "errors": 1}
    assert model.means["e2e"].total_s == pytest.approx(5.0)
    assert model.means["ttft"].total_s == pytest.approx(0.5)  # queue + first response
    assert model.means["itl"].count == 20
    assert model.requests_waiting is None  # no metrics text: unknown


def test_trtllm_serve_prometheus_families():
    text = (FIXTURES / "trtllm-serve-1.3-style.prometheus.txt").read_text()
    [model] = prometheus_models(text, ["llama"])
    assert model.name == "llama"  # "undefined" label renamed to the served model
    assert model.requests_running == 7
    assert model.requests_waiting == 2
    assert model.kv_cache_usage == pytest.approx(0.31)
    assert model.counters["requests"] == 62
    assert model.counters["errors"] == 2
    assert model.histograms["ttft"].count == 60


def test_trtllm_serve_before_1_3_has_no_error_counter_so_its_error_rate_is_unknown():
    """trtllm-serve 1.2 exports successes but no `trtllm_request_error_total`: its errors
    are unknown (no "errors" counter, so no error rate), never 0 errors."""
    text = (FIXTURES / "trtllm-serve-1.3-style.prometheus.txt").read_text()
    older = "\n".join(line for line in text.splitlines() if "trtllm_request_error" not in line)
    [model] = prometheus_models(older, ["llama"])
    assert model.counters["requests"] == 60  # the successes
    assert "errors" not in model.counters
    later = copy.deepcopy(model)
    later.counters["requests"] += 10
    window = ModelWindow(60)
    window.add(0.0, model)
    window.add(5.0, later)
    stats = window.stats()
    assert stats.request_rate == pytest.approx(2.0) and stats.error_rate is None


def test_real_vllm_0_32_metrics_as_scraped():
    import json

    served = [
        c["id"] for c in json.loads((FIXTURES / "vllm-0.32.0.models.json").read_text())["data"]
    ]
    [model] = read_metrics((FIXTURES / "vllm-0.32.0.busy.metrics.txt").read_text(), served)
    assert model.name == "tiny"
    assert model.requests_running is not None
    assert model.kv_cache_usage is not None
    assert set(model.histograms) == {"ttft", "itl", "e2e"}
    assert model.histograms["e2e"].count == model.counters["requests"] > 0
    [idle] = read_metrics((FIXTURES / "vllm-0.32.0.idle.metrics.txt").read_text(), served)
    assert idle.counters["requests"] == 0


def test_real_triton_2_51_statistics_of_a_decoupled_model():
    import json

    stats = json.loads((FIXTURES / "triton-2.51.0.stats.json").read_text())
    text = (FIXTURES / "triton-2.51.0.metrics.txt").read_text()
    [model] = read_models(["ensemble"], stats, text, frozenset({"ensemble"}))
    assert model.counters["requests"] == 9
    assert model.means["e2e"].count == 9
    assert model.means["e2e"].total_s == pytest.approx(0.556820817)
    # Triton 2.51 keeps no per-response statistics for this streaming model, so its TTFT
    # cannot be known from the engine side: no mean is made up from the whole request.
    assert "ttft" not in model.means
    assert model.requests_waiting == 0
    [plain] = read_models(["ensemble"], stats, text)  # not decoupled: TTFT is the response
    assert plain.means["ttft"].total_s == pytest.approx(0.556820817)
