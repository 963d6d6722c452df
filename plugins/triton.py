"""Triton Inference Server, including Triton serving TensorRT-LLM.

Server metadata, the repository index and per-model statistics come through
tritonclient; the metrics port (nv_inference_*, nv_trt_llm_*) through a bounded GET.
Triton's default metrics are cumulative counters, so latency is a windowed mean and
says so; when `histogram_latencies=true` is on, TTFT percentiles come from
nv_inference_first_response_histogram_ms.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from console.core.fetch import FetchError
from console.core.metrics.promtext import Exposition, MetricsGarbage, parse
from console.core.metrics.readings import (
    EngineReading,
    Histogram,
    MeanCounter,
    ModelReading,
    histograms_by,
    values_by,
)
from plugins.base import (
    Discovered,
    EnginePlugin,
    EngineTarget,
    ProbeContext,
    PromSeries,
    flag_value,
    json_number,
    local_url,
    port_from,
)

NS = 1e-9


class TritonPlugin(EnginePlugin):
    kind = "triton"
    needs_translation = True  # KServe v2 generate, not the OpenAI API
    serves_trtllm_engines = True  # the tensorrtllm backend
    # Its default metrics are cumulative counters: the mean request duration, not
    # percentiles; TTFT only where histogram_latencies=true exports the first response.
    prometheus = PromSeries(
        model_label="model",
        present="nv_inference_count",
        waiting="nv_inference_pending_request_count",
        histograms={"ttft": "nv_inference_first_response_histogram_ms"},
        histogram_scale=0.001,
        means={"e2e": ("nv_inference_request_duration_us", "nv_inference_request_success")},
        mean_scale=1e-6,
        requests=("nv_inference_request_success", "nv_inference_request_failure"),
        errors=("nv_inference_request_failure",),
    )
    process_markers = ("tritonserver",)

    def __init__(self) -> None:
        # tritonclient (and its aiohttp/gevent imports) loads only on a node that has Triton.
        self._clients: dict[str, tuple[str, Any]] = {}
        self._configs: dict[str, dict[str, Any]] = {}

    def discover(self, cmdline: list[str], listening: list[int]) -> Discovered | None:
        if not cmdline or not cmdline[0].endswith("tritonserver"):
            return None
        http = port_from(cmdline, ("--http-port",), [], 8000)
        metrics = port_from(cmdline, ("--metrics-port",), [], 8002)
        host = flag_value(cmdline, "--http-address")
        if http is None:
            return None
        return Discovered(
            local_url(host, http), local_url(host, metrics) if metrics is not None else None
        )

    def _client(self, target: EngineTarget, ctx: ProbeContext) -> Any:
        kept = self._clients.get(target.id)
        if kept is not None and kept[0] == target.endpoint:
            return kept[1]
        from plugins.triton_client import BoundedClient

        client = BoundedClient(urlsplit(target.endpoint).netloc, ctx.timeout, ctx.max_bytes)
        self._clients[target.id] = (target.endpoint, client)
        return client

    async def _decoupled(
        self,
        target: EngineTarget,
        client: Any,
        models: list[str],
        call: Any,
        reading: EngineReading,
    ) -> set[str]:
        """Which models stream (decoupled); their configs are read once per engine."""
        known = self._configs.setdefault(target.id, {})
        for name in models:
            if name not in known:
                try:
                    known[name] = await call(client.get_model_config(name))
                except Exception:  # retried at the next probe; the rest goes on
                    continue
        reading.config["models"] = {n: known[n] for n in models if n in known}
        return {
            n
            for n in models
            if (known.get(n) or {}).get("model_transaction_policy", {}).get("decoupled")
        }

    async def forget(self, target_id: str) -> None:
        self._configs.pop(target_id, None)
        kept = self._clients.pop(target_id, None)
        if kept is not None:
            await kept[1].close()

    async def probe(self, target: EngineTarget, ctx: ProbeContext) -> EngineReading:
        try:
            ready = await ctx.get(f"{target.endpoint}/v2/health/ready")
        except FetchError as exc:
            return EngineReading(
                state="down" if exc.refused else "unhealthy", reason=f"/v2/health/ready: {exc}"
            )
        client = self._client(target, ctx)

        async def call(coro: Any) -> Any:
            return await asyncio.wait_for(coro, ctx.timeout)

        metrics_url = target.metrics_endpoint or _default_metrics(target.endpoint)
        results: tuple[Any, ...] = await asyncio.gather(
            call(client.get_server_metadata()),
            call(client.get_model_repository_index()),
            call(client.get_inference_statistics()),
            ctx.get(f"{metrics_url}/metrics"),
            return_exceptions=True,
        )
        meta, index, stats, metrics = results
        problems: list[str] = []
        reading = EngineReading(state="ready" if ready.status == 200 else "unhealthy")
        if ready.status != 200:
            problems.append(f"/v2/health/ready answered {ready.status} (a model is not ready)")
        if isinstance(meta, dict):
            reading.version = str(meta.get("version")) if meta.get("version") else None
            reading.config["extensions"] = meta.get("extensions")
        else:
            problems.append(f"server metadata: {_why(meta)}")
        ready_models = _ready_models(index, problems, reading)
        exp: Exposition | None = None
        if isinstance(metrics, BaseException):
            problems.append(f"metrics {metrics_url}: {_why(metrics)}")
        elif metrics.status != 200:
            problems.append(f"metrics {metrics_url} answered {metrics.status}")
        else:
            try:
                exp = parse(metrics.text(), ("nv_",))
            except MetricsGarbage as exc:
                problems.append(f"metrics: {exc}")
        if isinstance(stats, BaseException):
            problems.append(f"statistics: {_why(stats)}")
            stats = {}
        decoupled = await self._decoupled(target, client, ready_models, call, reading)
        steps = _ensemble_steps(reading.config.get("models", {}))
        reading.models = _models(ready_models, stats, exp, decoupled, steps)
        if not ready_models and reading.state == "ready":
            reading.state = "unhealthy"
            problems.append("no model is READY in the repository")
        reading.reason = "; ".join(problems) or None
        return reading


def _default_metrics(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.hostname}:8002"


def _why(exc: Any) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc) or exc.__class__.__name__
    return text[:200]


def _ready_models(index: Any, problems: list[str], reading: EngineReading) -> list[str]:
    if not isinstance(index, list):
        problems.append(f"repository index: {_why(index)}")
        return []
    ready = []
    not_ready = []
    for entry in index:
        if not isinstance(entry, dict) or "name" not in entry:
            continue
        if entry.get("state") == "READY":
            ready.append(str(entry["name"]))
        elif entry.get("state"):
            reason = entry.get("reason") or ""
            not_ready.append(
                f"{entry['name']} {entry['state']}" + (f" ({reason})" if reason else "")
            )
    if not_ready:
        problems.append("models not ready: " + ", ".join(not_ready))
    reading.config["repository"] = index
    return list(dict.fromkeys(ready))


def _duration(stat: Any) -> tuple[float, float] | None:
    """(count, ns) of a statistics entry (absent: 0, 0); None when a field is not a
    number (before, "abc" or a 400-digit count raised, and the engine showed unhealthy:
    "probe failed")."""
    if not isinstance(stat, dict):
        return 0.0, 0.0
    count, ns = json_number(stat.get("count", 0)), json_number(stat.get("ns", 0))
    return None if count is None or ns is None else (count, ns)


def _ensemble_steps(configs: dict[str, Any]) -> dict[str, list[str]]:
    """Each ensemble's step models, from the model configs ("ensemble_scheduling")."""
    out = {}
    for name, config in configs.items():
        scheduling = (config or {}).get("ensemble_scheduling") or {}
        steps = [
            str(s.get("model_name")) for s in scheduling.get("step", []) if isinstance(s, dict)
        ]
        if steps:
            out[name] = steps
    return out


def _models(
    names: list[str],
    stats: Any,
    exp: Exposition | None,
    decoupled: set[str],
    steps: dict[str, list[str]] | None = None,
) -> list[ModelReading]:
    by_name: dict[str, dict[str, Any]] = {}
    for entry in stats.get("model_stats", []) if isinstance(stats, dict) else []:
        if isinstance(entry, dict) and "name" in entry:
            by_name.setdefault(str(entry["name"]), entry)
    gauges = _gauges(exp)
    first_response = (
        histograms_by(exp, "nv_inference_first_response_histogram_ms", "model")
        if exp is not None
        else {}
    )
    out = []
    for name in names:
        model = ModelReading(name=name)
        entry = by_name.get(name)
        if entry is not None:
            _from_statistics(model, entry, name in decoupled)
        # An ensemble (the TensorRT-LLM layout) schedules its requests on its step models:
        # the TensorRT-LLM backend reports running, waiting and KV on `tensorrt_llm`.
        sources = [name, *(steps or {}).get(name, [])]
        model.requests_waiting = _first_of(gauges["waiting"], sources)
        if model.requests_waiting is None:
            model.requests_waiting = gauges["pending"].get(name)
        model.requests_running = _first_of(gauges["running"], sources)
        model.kv_cache_usage = _first_of(gauges["kv"], sources)
        hist = first_response.get(name)
        if hist is not None:
            model.histograms["ttft"] = Histogram(
                tuple(b / 1000 for b in hist.bounds), hist.counts, hist.sum / 1000, hist.count
            )
        out.append(model)
    return out


def _first_of(values: dict[str, float], names: list[str]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def _from_statistics(model: ModelReading, entry: dict[str, Any], decoupled: bool) -> None:
    """The counters and means of one model's statistics; a figure whose entry holds
    something other than numbers is left out (unknown)."""
    inference = entry.get("inference_stats") or {}
    ok, fail = _duration(inference.get("success")), _duration(inference.get("fail"))
    queue = _duration(inference.get("queue"))
    if ok is not None and fail is not None:
        model.counters["requests"] = ok[0] + fail[0]
        model.counters["errors"] = fail[0]
    if ok is not None:
        model.means["e2e"] = MeanCounter(ok[1] * NS, ok[0])
    responses = entry.get("response_stats") or {}
    if isinstance(responses, dict) and responses:
        # Decoupled (streaming) models time each response. Response 0 is the first token:
        # its compute time plus the request's queue time approximates the mean TTFT.
        first = _duration((responses.get("0") or {}).get("success"))
        if first is not None and queue is not None and first[0]:
            model.means["ttft"] = MeanCounter((first[1] + queue[1]) * NS, first[0])
        later: tuple[float, float] | None = (0.0, 0.0)
        for key, response in responses.items():
            if key != "0" and isinstance(response, dict) and later is not None:
                this = _duration(response.get("success"))
                later = None if this is None else (later[0] + this[0], later[1] + this[1])
        if later is not None:
            model.means["itl"] = MeanCounter(later[1] * NS, later[0])
    elif not decoupled and ok is not None:
        # One response per request: the first token arrives with the whole answer.
        model.means["ttft"] = MeanCounter(ok[1] * NS, ok[0])
    # A decoupled model without per-response statistics: its TTFT is not knowable here.


def _gauges(exp: Exposition | None) -> dict[str, dict[str, float]]:
    if exp is None:
        return {"pending": {}, "waiting": {}, "running": {}, "kv": {}}
    return {
        "pending": values_by(exp, "nv_inference_pending_request_count", "model"),
        # TensorRT-LLM backend families (only from the real C++ backend).
        "waiting": values_by(exp, "nv_trt_llm_request_metrics", "model", request_type="waiting"),
        "running": values_by(exp, "nv_trt_llm_request_metrics", "model", request_type="scheduled"),
        "kv": values_by(
            exp, "nv_trt_llm_kv_cache_block_metrics", "model", kv_cache_block_type="fraction"
        ),
    }


def read_models(
    names: list[str],
    stats: Any,
    metrics_text: str | None,
    decoupled: frozenset[str] = frozenset(),
    configs: dict[str, Any] | None = None,
) -> list[ModelReading]:
    """Model readings from Triton's statistics JSON, metrics-port text and model configs."""
    exp = parse(metrics_text, ("nv_",)) if metrics_text is not None else None
    return _models(names, stats, exp, set(decoupled), _ensemble_steps(configs or {}))
