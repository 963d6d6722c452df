"""trtllm-serve, TensorRT-LLM's OpenAI server.

Its `/metrics` is JSON iteration stats (drained on read), and Prometheus text with
`trtllm_*` histograms lives at `/prometheus/metrics` when `return_perf_metrics` is on.
The gauges (running, waiting, KV) appeared in 1.3, so every family is optional.
"""

from __future__ import annotations

from typing import Any

from console.core.fetch import FetchError, Response
from console.core.metrics.promtext import MetricsGarbage, parse
from console.core.metrics.readings import EngineReading, ModelReading, histograms_by, values_by
from plugins import openai_server
from plugins.base import (
    Discovered,
    EnginePlugin,
    EngineTarget,
    ProbeContext,
    json_number,
)


class TrtllmPlugin(EnginePlugin):
    kind = "trtllm"
    process_markers = ("trtllm-serve",)
    serves_trtllm_engines = True

    def discover(self, cmdline: list[str], listening: list[int]) -> Discovered | None:
        if not any(a.endswith("trtllm-serve") for a in cmdline[:2]):
            return None
        return openai_server.discover(cmdline, listening)

    async def probe(self, target: EngineTarget, ctx: ProbeContext) -> EngineReading:
        base = target.endpoint
        answers = await openai_server.probe(ctx, base, "/prometheus/metrics")
        if isinstance(answers, EngineReading):
            return answers
        health, prom = answers.health, answers.metrics
        problems: list[str] = []
        reading = EngineReading(state="ready" if health.status == 200 else "unhealthy")
        if health.status != 200:
            problems.append(f"/health answered {health.status}")
        reading.version = openai_server.version(answers.version)
        served = openai_server.served_models(answers.models, []) or []
        if isinstance(prom, Response) and prom.status == 200:
            try:
                reading.models = prometheus_models(prom.text(), served)
            except MetricsGarbage as exc:
                problems.append(f"/prometheus/metrics: {exc}")
        if not reading.models:
            # No Prometheus endpoint: the JSON iteration stats still give load and KV.
            stats = await _iteration_stats(ctx, base)
            reading.models = [iteration_model(name, stats) for name in served]
        reading.reason = "; ".join(problems) or None
        return reading


async def _iteration_stats(ctx: ProbeContext, base: str) -> dict[str, Any] | None:
    try:
        resp = await ctx.get(f"{base}/metrics")
        data = resp.json() if resp.status == 200 else None
    except FetchError:
        return None
    if isinstance(data, list) and data and isinstance(data[-1], dict):
        return data[-1]
    return None


def iteration_model(name: str, stats: dict[str, Any] | None) -> ModelReading:
    """A model reading from the newest JSON iteration-stats entry (None: nothing known)."""
    model = ModelReading(name=name)
    if not stats:
        return model
    model.requests_running = json_number(stats.get("numActiveRequests"))
    model.requests_waiting = json_number(stats.get("numQueuedRequests"))
    kv = stats.get("kvCacheStats")
    if isinstance(kv, dict):
        used, blocks = json_number(kv.get("usedNumBlocks", 0)), json_number(kv.get("maxNumBlocks"))
        if used is not None and blocks is not None and blocks >= 1:  # else unknown
            model.kv_cache_usage = used / blocks
    return model


def prometheus_models(text: str, served: list[str]) -> list[ModelReading]:
    """Model readings from trtllm-serve's `trtllm_*` Prometheus text."""
    exp = parse(text, ("trtllm_",))
    group = "model_name"
    finished = values_by(exp, "trtllm_request_success_total", group)
    errors = values_by(exp, "trtllm_request_error_total", group)
    running = values_by(exp, "trtllm_num_requests_running", group)
    waiting = values_by(exp, "trtllm_num_requests_waiting", group)
    kv = values_by(exp, "trtllm_kv_cache_utilization", group)
    prompt = values_by(exp, "trtllm_prompt_tokens_total", group)
    generated = values_by(exp, "trtllm_generation_tokens_total", group)
    hists = {
        "ttft": histograms_by(exp, "trtllm_time_to_first_token_seconds", group),
        "itl": histograms_by(exp, "trtllm_time_per_output_token_seconds", group),
        "e2e": histograms_by(exp, "trtllm_e2e_request_latency_seconds", group),
    }
    labelled = list(dict.fromkeys([*finished, *running, *hists["e2e"]]))
    # Older servers label every series model_name="undefined": give them the served name.
    rename = {"undefined": served[0]} if served and labelled == ["undefined"] else {}
    out = []
    for label in labelled:
        model = ModelReading(
            name=rename.get(label, label),
            requests_running=running.get(label),
            requests_waiting=waiting.get(label),
            kv_cache_usage=kv.get(label),
        )
        if label in finished:
            # trtllm-serve before 1.3 exports no error counter: its errors are unknown (the
            # gateway's count shows them), never 0, and its requests are the successes.
            failed = errors.get(label)
            model.counters["requests"] = finished[label] + (failed or 0.0)
            if failed is not None:
                model.counters["errors"] = failed
        if label in prompt:
            model.counters["prompt_tokens"] = prompt[label]
        if label in generated:
            model.counters["generation_tokens"] = generated[label]
        for key, by_label in hists.items():
            if label in by_label:
                model.histograms[key] = by_label[label]
        out.append(model)
    return out
