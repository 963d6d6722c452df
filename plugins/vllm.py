"""vLLM's OpenAI server: /health, /version, /v1/models, /metrics (vllm:*)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from console.core.config.model import Profile
from console.core.fetch import Response
from console.core.launch import Launch, apply_overrides, flag_args, gpu_env
from console.core.metrics.promtext import Exposition, MetricsGarbage, parse
from console.core.metrics.readings import (
    EngineReading,
    ModelReading,
    capped_reasons,
    histograms_by,
    values_by,
    values_by_pair,
)
from plugins import openai_server
from plugins.base import (
    Discovered,
    EnginePlugin,
    EngineTarget,
    ProbeContext,
    PromSeries,
    flag_value,
)

# Current names first; the names renamed or removed since 0.10 follow as fallbacks.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
TTFT = ("vllm:time_to_first_token_seconds",)
E2E = ("vllm:e2e_request_latency_seconds",)
# (hits, queries): in tokens; the gpu_ names until 0.11, gone in 0.12.
PREFIX_CACHE = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
)
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # after 0.12; label `reason`
DEFAULT_COMMAND = ("vllm", "serve")


class VllmPlugin(EnginePlugin):
    kind = "vllm"
    process_markers = ("vllm.entrypoints", "vllm serve")
    can_launch = True
    drill_baseline = True
    prometheus = PromSeries(
        model_label="model_name",
        present="vllm:num_requests_running",
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_cache="vllm:kv_cache_usage_perc",
        histograms={"ttft": TTFT[0], "itl": ITL[0], "e2e": E2E[0]},
        requests=("vllm:request_success_total",),
        errors=('vllm:request_success_total{finished_reason="error"}',),
        generation_tokens="vllm:generation_tokens_total",
        preemptions="vllm:num_preemptions_total",
        prefix_cache=PREFIX_CACHE[0],
        waiting_by_reason=(WAITING_BY_REASON, "reason"),
        # prometheus_client's own, for the process that serves /metrics: the API server
        # (absent with several API servers, whose registry is multiprocess)
        process_cpu="process_cpu_seconds_total",
    )
    # vLLM's log lines that mark the cold-start phases, first match wins (V1 engine, 0.8-0.32).
    ready_phases = (
        ("engine_init", ("Initializing a V1 LLM engine", "Initializing an LLM engine")),
        ("weights_loaded", ("Loading weights took", "Model loading took")),
        ("kv_cache_allocated", ("KV cache size:", "init engine (profile, create kv cache")),
        ("graphs_captured", ("Graph capturing finished",)),
        ("server_up", ("Starting vLLM server on", "Starting vLLM API server", "startup complete")),
    )

    def launch(self, profile: Profile, overrides: Mapping[str, Any]) -> Launch:
        """`vllm serve MODEL` (or the profile's command) with the profile's flags."""
        applied = apply_overrides(profile, overrides)
        args = applied.args
        command = list(profile.command or DEFAULT_COMMAND)
        # `vllm serve MODEL` takes the model as its argument; the module entry point as --model.
        argv = (
            [*command, profile.model]
            if command[-1] == "serve"
            else [*command, f"--model={profile.model}"]
        )
        argv += [
            f"--served-model-name={profile.served_model_name}",
            f"--port={applied.port}",
        ]
        if applied.tensor_parallel_size > 1:
            argv.append(f"--tensor-parallel-size={applied.tensor_parallel_size}")
        if "shutdown_timeout" not in args:
            # SIGTERM drains in-flight requests for this long, inside the agent's stop grace.
            args["shutdown_timeout"] = max(1, int(profile.stop_grace_s) - 5)
        argv += flag_args(args)
        return Launch(
            tuple(argv),
            gpu_env(profile, applied.gpus),
            applied.port,
            tuple(applied.gpus),
            dict(args),
        )

    def api_server_process(self, cmdline: list[str]) -> bool:
        """One API server runs in the main process, the EngineCore in a child. With
        several (`--api-server-count`, which defaults to the data-parallel size) the main
        process only starts them: its CPU is not theirs."""
        count = flag_value(cmdline, "--api-server-count", "-asc")
        if count is None:
            count = flag_value(cmdline, "--data-parallel-size", "-dp") or "1"
        return count.strip() == "1"

    def discover(self, cmdline: list[str], listening: list[int]) -> Discovered | None:
        joined = " ".join(cmdline[:4])
        is_server = (
            "vllm.entrypoints.openai.api_server" in cmdline
            or (any(a.endswith("vllm") for a in cmdline[:2]) and "serve" in cmdline[1:3])
            or "vllm.entrypoints.cli.main serve" in joined
        )
        return openai_server.discover(cmdline, listening) if is_server else None

    async def probe(self, target: EngineTarget, ctx: ProbeContext) -> EngineReading:
        answers = await openai_server.probe(ctx, target.endpoint, "/metrics")
        if isinstance(answers, EngineReading):
            return answers
        health, models, metrics = answers.health, answers.models, answers.metrics
        reading = EngineReading(state="ready", version=openai_server.version(answers.version))
        problems: list[str] = []
        if health.status != 200:
            reading.state = "unhealthy"
            problems.append(
                f"/health answered {health.status}"
                + (" (engine dead)" if health.status == 503 else "")
            )
        served = openai_server.served_models(models, problems)
        if served == [] and reading.state == "ready":
            reading.state = "unhealthy"
            problems.append("/v1/models lists no model")
        exp = _exposition(metrics, problems)
        if exp is not None:
            reading.models = _models(exp, served or [])
            reading.config = _cache_config(exp)
            if _asleep(exp):
                reading.state = "unhealthy"
                problems.append(
                    "engine is asleep (sleep mode): /health says 200 but it cannot serve"
                )
        elif served:
            reading.models = [ModelReading(name) for name in served]
        reading.reason = "; ".join(problems) or None
        return reading


def _exposition(result: Response | BaseException, problems: list[str]) -> Exposition | None:
    if isinstance(result, BaseException):
        problems.append(f"/metrics: {result}")
        return None
    if result.status != 200:
        problems.append(f"/metrics answered {result.status}")
        return None
    try:
        return parse(result.text(), ("vllm:",))
    except MetricsGarbage as exc:
        problems.append(f"/metrics: {exc}")
        return None


def _first(exp: Exposition, names: tuple[str, ...], **match: str) -> dict[str, float]:
    for name in names:
        values = values_by(exp, name, "model_name", **match)
        if values:
            return values
    return {}


def _first_hist(exp: Exposition, names: tuple[str, ...]) -> dict[str, Any]:
    for name in names:
        hists = histograms_by(exp, name, "model_name")
        if hists:
            return hists
    return {}


def _models(exp: Exposition, served: list[str]) -> list[ModelReading]:
    running = values_by(exp, "vllm:num_requests_running", "model_name")
    waiting = values_by(exp, "vllm:num_requests_waiting", "model_name")
    kv = _first(exp, KV_USAGE)
    finished = values_by(exp, "vllm:request_success_total", "model_name")
    errors = values_by(exp, "vllm:request_success_total", "model_name", finished_reason="error")
    prompt = values_by(exp, "vllm:prompt_tokens_total", "model_name")
    generated = values_by(exp, "vllm:generation_tokens_total", "model_name")
    preempted = values_by(exp, "vllm:num_preemptions_total", "model_name")
    by_reason = values_by_pair(exp, WAITING_BY_REASON, "model_name", "reason")
    hits: dict[str, float] = {}
    queries: dict[str, float] = {}
    for hits_name, queries_name in PREFIX_CACHE:  # both from one generation of names
        queries = values_by(exp, queries_name, "model_name")
        if queries:
            hits = values_by(exp, hits_name, "model_name")
            break
    hists = {
        "ttft": _first_hist(exp, TTFT),
        "itl": _first_hist(exp, ITL),
        "e2e": _first_hist(exp, E2E),
    }
    names = list(dict.fromkeys([*served, *running, *finished]))
    out = []
    for name in names:
        model = ModelReading(
            name=name,
            requests_running=running.get(name),
            requests_waiting=waiting.get(name),
            kv_cache_usage=kv.get(name),
        )
        if name in by_reason:
            model.waiting_by_reason = capped_reasons(by_reason[name])
        if name in finished:
            model.counters["requests"] = finished[name]
            model.counters["errors"] = errors.get(name, 0.0)
        if name in prompt:
            model.counters["prompt_tokens"] = prompt[name]
        if name in generated:
            model.counters["generation_tokens"] = generated[name]
        if name in preempted:
            model.counters["preemptions"] = preempted[name]
        if name in queries and name in hits:
            model.counters["prefix_cache_hits"] = hits[name]
            model.counters["prefix_cache_queries"] = queries[name]
        for key, by_model in hists.items():
            if name in by_model:
                model.histograms[key] = by_model[name]
        out.append(model)
    return out


def _cache_config(exp: Exposition) -> dict[str, Any]:
    for sample in exp.samples:
        if sample.name == "vllm:cache_config_info":
            return {"cache_config_info": dict(sample.labels)}
    return {}


def _asleep(exp: Exposition) -> bool:
    awake = [
        s.value
        for s in exp.samples
        if s.name == "vllm:engine_sleep_state" and s.labels.get("sleep_state") == "awake"
    ]
    return bool(awake) and all(v == 0 for v in awake)


def read_metrics(text: str, served: list[str]) -> list[ModelReading]:
    """Model readings from a vLLM /metrics text (any version since 0.8)."""
    return _models(parse(text, ("vllm:",)), served)
