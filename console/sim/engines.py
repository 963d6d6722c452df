"""SIMULATED engine servers: vLLM-like and Triton-like (serving TensorRT-LLM), over real HTTP.

They answer the routes the real plugins read, with the real engines' shapes (compare
tests/fixtures/vllm-0.32.0.*, triton-2.51.0.* and triton-trtllm-backend.metrics.txt), and
the inference routes a gateway sends traffic to: OpenAI completions and chat completions
(streamed with SSE when asked) on vLLM, `generate` and `generate_stream` on Triton. Every
number comes from the engine's `Workload`; versions end in "-sim", so nothing passes for a
real engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from console.sim.load import CLIENT_MARK, FINISH_REASONS, Histogram, Plan, Workload

VLLM_VERSION = "0.32.0-sim"
TRITON_VERSION = "2.51.0-sim"
MAX_MODEL_LEN = 8192

# Placeholder text: a simulated engine must never pass for a real one, even in its output.
_TEXT = (
    "This is a SIMULATED answer from the engineroom demo fleet; no model ran and no GPU "
    "was used. The tokens arrive at the pace the simulated engine would have produced "
    "them, so gateways, dashboards and alerts can be tried without hardware."
)
_WORDS = _TEXT.split(" ")
_ids = itertools.count(1)

# HELP texts as vLLM 0.32 writes them; `_created` samples are gauges, as prometheus_client has.
VLLM_FAMILIES = {
    "vllm:num_requests_running": ("gauge", "Number of requests in model execution batches."),
    "vllm:num_requests_waiting": ("gauge", "Number of requests waiting to be processed."),
    "vllm:num_requests_waiting_by_reason": ("gauge", "Number of waiting requests by reason."),
    "vllm:engine_sleep_state": ("gauge", "Engine sleep state; awake = 0 means engine is sleeping"),
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
    "vllm:prefix_cache_queries_total": (
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    "vllm:prefix_cache_hits_total": (
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
    "vllm:num_preemptions_total": ("counter", "Cumulative number of preemption from the engine."),
    "vllm:prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "vllm:generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "vllm:request_success_total": ("counter", "Count of successfully processed requests."),
    "vllm:time_to_first_token_seconds": (
        "histogram",
        "Histogram of time to first token in seconds.",
    ),
    "vllm:inter_token_latency_seconds": (
        "histogram",
        "Histogram of inter-token latency in seconds.",
    ),
    "vllm:e2e_request_latency_seconds": (
        "histogram",
        "Histogram of e2e request latency in seconds.",
    ),
    "vllm:cache_config_info": ("gauge", "Information of the LLMEngine CacheConfig"),
}


def words(n: int) -> list[str]:
    """`n` tokens of placeholder text, each with its leading space."""
    return [" " + _WORDS[i % len(_WORDS)] for i in range(n)]


def _num(value: float, integers: bool) -> str:
    # prometheus_client (vLLM) writes every value as a float ("8.0"); Triton's C++
    # exposer writes whole numbers without a fraction ("9").
    if integers and float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class _Metrics:
    """A Prometheus text exposition; each family's HELP and TYPE come from `families`."""

    def __init__(self, families: dict[str, tuple[str, str]], integers: bool = False) -> None:
        self.families = families  # name -> (type, help)
        self.integers = integers
        self.lines: list[str] = []
        self._seen: set[str] = set()

    def _header(self, family: str) -> None:
        if family not in self._seen:
            self._seen.add(family)
            kind, help_text = self.families.get(family, ("gauge", ""))
            self.lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}"]

    def add(self, name: str, labels: dict[str, str], value: float, family: str = "") -> None:
        self._header(family or name)
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        self.lines.append(f"{name}{{{inner}}} {_num(value, self.integers)}")

    def histogram(self, name: str, labels: dict[str, str], hist: Histogram) -> None:
        for bound, count in zip((*hist.bounds, None), hist.cumulative(), strict=True):
            le = "+Inf" if bound is None else _num(bound, self.integers)
            self.add(f"{name}_bucket", {**labels, "le": le}, count, family=name)
        self.add(f"{name}_count", labels, hist.count, family=name)
        self.add(f"{name}_sum", labels, hist.sum, family=name)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


async def _serve(app: web.Application, socks: list[socket.socket]) -> web.AppRunner:
    # No access log (the demo prints nothing), and a short shutdown: streams are simulated.
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    for sock in socks:
        await web.SockSite(runner, sock, shutdown_timeout=1.0).start()
    return runner


class _Request:
    """One request answered over HTTP: counted in the batch, and recorded when it ends."""

    def __init__(self, workload: Workload, plan: Plan) -> None:
        self.workload = workload
        self.plan = plan
        self.sent = 0
        self.reason = "abort"  # until it runs to its end

    def __enter__(self) -> _Request:
        self.workload.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.workload.finish(self.plan, self.sent, self.reason)

    async def tokens(self) -> AsyncIterator[str]:
        """The answer's tokens, each at the time the simulated engine would send it: first
        the API server's share, which the engine's TTFT histogram does not see, then the
        engine's own time to first token."""
        await asyncio.sleep(self.plan.api_s + self.plan.ttft_s)
        for i, token in enumerate(words(self.plan.tokens)):
            if i:
                await asyncio.sleep(self.plan.itl_s)
            self.sent += 1
            yield token


async def _sse(
    request: web.Request, events: AsyncIterator[dict[str, Any] | str]
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    try:
        async for event in events:
            data = event if isinstance(event, str) else json.dumps(event)
            await resp.write(f"data: {data}\n\n".encode())
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client left: the request is counted as aborted, as vLLM counts it
    return resp


class VllmEngine:
    """A vLLM-like OpenAI server for one model."""

    kind = "vllm"

    def __init__(self, workload: Workload, model: str, *, gpus: int) -> None:
        self.workload = workload
        self.model = model
        self.gpus = gpus
        self.created = int(time.time())
        self._runner: web.AppRunner | None = None

    async def start(self, sock: socket.socket) -> None:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        self._runner = await _serve(app, [sock])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": f"/models/{self.model} (SIMULATED)",
            "parent": None,
            "max_model_len": MAX_MODEL_LEN,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.exposition(), content_type="text/plain")

    def exposition(self) -> str:
        """The vllm:* families the console reads, with vLLM 0.32's names and labels."""
        w, m = self.workload, _Metrics(VLLM_FAMILIES)
        base = {"engine": "0", "model_name": self.model}
        m.add("vllm:num_requests_running", base, round(w.batch))
        m.add("vllm:num_requests_waiting", base, round(w.waiting))
        for reason, value in (("capacity", round(w.waiting)), ("deferred", 0)):
            m.add("vllm:num_requests_waiting_by_reason", {**base, "reason": reason}, value)
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            m.add("vllm:engine_sleep_state", {**base, "sleep_state": state}, value)
        m.add("vllm:kv_cache_usage_perc", base, w.kv_usage)
        counters = (
            ("vllm:prefix_cache_queries", w.prefix_queries),
            ("vllm:prefix_cache_hits", w.prefix_hits),
            ("vllm:num_preemptions", w.preemptions),
            ("vllm:prompt_tokens", w.prompt_total),
            ("vllm:generation_tokens", w.generation_total),
        )
        for name, value in counters:
            m.add(f"{name}_total", base, value)
            m.add(f"{name}_created", base, self.created)
        for reason in FINISH_REASONS:
            labels = {**base, "finished_reason": reason}
            m.add("vllm:request_success_total", labels, w.finished[reason])
        for name, hist in (
            ("vllm:time_to_first_token_seconds", w.ttft),
            ("vllm:inter_token_latency_seconds", w.itl),
            ("vllm:e2e_request_latency_seconds", w.e2e),
        ):
            m.histogram(name, base, hist)
            m.add(f"{name}_created", base, self.created)
        info = {
            "block_size": "16",
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "engine": "0",
            "gpu_memory_utilization": "0.9",
            "kv_cache_size_tokens": str(w.traffic.kv_tokens),
            "num_gpu_blocks": str(w.traffic.kv_tokens // 16),
            "simulated": "True",
        }
        m.add("vllm:cache_config_info", info, 1.0)
        return m.text()

    # --- OpenAI inference
    def _error(
        self, status: int, kind: str, message: str, param: str | None = None
    ) -> web.Response:
        body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
        return web.json_response(body, status=status)

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return self._error(400, "BadRequestError", "the request body is not valid JSON")
        if not isinstance(body, dict):
            return self._error(400, "BadRequestError", "the request body must be a JSON object")
        if body.get("model") != self.model:
            return self._error(
                404, "NotFoundError", f"The model `{body.get('model')}` does not exist.", "model"
            )
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_MODEL_LEN
        ):
            return self._error(
                400,
                "BadRequestError",
                f"max_tokens must be an integer from 1 to {MAX_MODEL_LEN}",
                "max_tokens",
            )
        return body

    def _plan(self, body: dict[str, Any], prompt: str, default_max: int | None) -> Plan:
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", default_max))
        now = time.monotonic()
        if CLIENT_MARK in prompt:  # a demo client's request: it stands for others
            self.workload.arrived(now)
        plan = self.workload.plan(now, max(1, len(prompt) // 4), max_tokens)
        if body.get("ignore_eos") and max_tokens is not None:
            plan.tokens = max_tokens
        return plan

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt", "")
        prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
        plan = self._plan(body, prompt, 16)  # OpenAI's default max_tokens for completions

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }

        return await self._answer(request, body, plan, "text_completion", choice)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._error(400, "BadRequestError", "messages must be a non-empty list")
        prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        plan = self._plan(body, prompt, None)
        first = [True]

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            if body.get("stream"):
                delta: dict[str, Any] = {"content": text} if text or finish is None else {}
                if first[0]:
                    delta["role"] = "assistant"
                    first[0] = False
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            message = {"role": "assistant", "content": text}
            return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}

        return await self._answer(request, body, plan, "chat.completion", choice)

    async def _answer(
        self,
        request: web.Request,
        body: dict[str, Any],
        plan: Plan,
        kind: str,
        choice: Callable[[str, str | None], dict[str, Any]],
    ) -> web.StreamResponse:
        rid = f"{'chatcmpl' if kind.startswith('chat') else 'cmpl'}-sim-{next(_ids)}"
        head = {"id": rid, "created": int(time.time()), "model": self.model}
        finish = "length" if plan.tokens == body.get("max_tokens", -1) else "stop"

        def usage(sent: int) -> dict[str, int]:
            return {
                "prompt_tokens": plan.prompt_tokens,
                "completion_tokens": sent,
                "total_tokens": plan.prompt_tokens + sent,
            }

        with _Request(self.workload, plan) as req:
            if not body.get("stream"):
                text = "".join([t async for t in req.tokens()])
                req.reason = finish
                answer = {**head, "object": kind, "choices": [choice(text, finish)]}
                return web.json_response({**answer, "usage": usage(req.sent)})
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunk_kind = f"{kind}.chunk" if kind.startswith("chat") else kind

            async def events() -> AsyncIterator[dict[str, Any] | str]:
                extra = {"usage": None} if with_usage else {}
                async for token in req.tokens():
                    last = req.sent == plan.tokens
                    yield {
                        **head,
                        "object": chunk_kind,
                        "choices": [choice(token, finish if last else None)],
                        **extra,
                    }
                req.reason = finish
                if with_usage:
                    yield {**head, "object": chunk_kind, "choices": [], "usage": usage(req.sent)}
                yield "[DONE]"

            return await _sse(request, events())


# Triton serving TensorRT-LLM: the usual four-model repository.
ENSEMBLE, PREPROCESSING, TENSORRT_LLM, POSTPROCESSING = (
    "ensemble",
    "preprocessing",
    "tensorrt_llm",
    "postprocessing",
)
TRITON_MODELS = (ENSEMBLE, PREPROCESSING, TENSORRT_LLM, POSTPROCESSING)
DECOUPLED = {ENSEMBLE, TENSORRT_LLM}
NS = 1_000_000_000

# Each model's inputs and outputs: (name, data type[, optional]).
TRITON_IO: dict[str, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]] = {
    ENSEMBLE: (
        [
            ("text_input", "TYPE_STRING"),
            ("max_tokens", "TYPE_INT32"),
            ("stream", "TYPE_BOOL", True),
            ("temperature", "TYPE_FP32", True),
        ],
        [("text_output", "TYPE_STRING")],
    ),
    PREPROCESSING: (
        [("QUERY", "TYPE_STRING"), ("REQUEST_OUTPUT_LEN", "TYPE_INT32")],
        [("INPUT_ID", "TYPE_INT32"), ("REQUEST_OUTPUT_LEN", "TYPE_INT32")],
    ),
    TENSORRT_LLM: (
        [("input_ids", "TYPE_INT32"), ("request_output_len", "TYPE_INT32")],
        [("output_ids", "TYPE_INT32"), ("sequence_length", "TYPE_INT32")],
    ),
    POSTPROCESSING: (
        [("TOKENS_BATCH", "TYPE_INT32"), ("SEQUENCE_LENGTH", "TYPE_INT32")],
        [("OUTPUT", "TYPE_STRING")],
    ),
}

# HELP texts as Triton 2.51 and the TensorRT-LLM backend write them.
TRITON_FAMILIES = {
    "nv_inference_request_success": (
        "counter",
        "Number of successful inference requests, all batch sizes",
    ),
    "nv_inference_request_failure": (
        "counter",
        "Number of failed inference requests, all batch sizes",
    ),
    "nv_inference_count": (
        "counter",
        "Number of inferences performed (does not include cached requests)",
    ),
    "nv_inference_exec_count": (
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    "nv_inference_request_duration_us": (
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    "nv_inference_queue_duration_us": (
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    "nv_inference_compute_input_duration_us": (
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_infer_duration_us": (
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_output_duration_us": (
        "counter",
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)",
    ),
    "nv_inference_pending_request_count": (
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    "nv_trt_llm_request_metrics": ("gauge", "TRT LLM request metrics"),
    "nv_trt_llm_kv_cache_block_metrics": ("gauge", "TRT LLM KV cache block metrics"),
    "nv_trt_llm_general_metrics": ("gauge", "General TRT LLM metrics"),
}


def _duration(count: float, seconds: float) -> dict[str, int]:
    return {"count": int(count), "ns": int(seconds * NS)}


def _tensor(name: str, dtype: str, optional: bool = False) -> dict[str, Any]:
    """A tensor in a model config, as Triton's config JSON spells it."""
    return {
        "name": name,
        "data_type": dtype,
        "format": "FORMAT_NONE",
        "dims": [1],
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": optional,
        "is_non_linear_format_io": False,
    }


class TritonEngine:
    """A Triton-like server for one LLM built with TensorRT-LLM (ensemble + three models)."""

    kind = "triton"

    def __init__(self, workload: Workload, llm: str) -> None:
        self.workload = workload
        self.llm = llm
        self._runners: list[web.AppRunner] = []

    async def start(self, http: socket.socket, metrics: socket.socket) -> None:
        app = web.Application()
        app.router.add_get("/v2/health/ready", self.ok)
        app.router.add_get("/v2/health/live", self.ok)
        app.router.add_get("/v2", self.server_metadata)
        app.router.add_post("/v2/repository/index", self.repository_index)
        app.router.add_get("/v2/models/stats", self.stats)
        app.router.add_get("/v2/models/{model}", self.model_metadata)
        app.router.add_get("/v2/models/{model}/ready", self.model_ready)
        app.router.add_get("/v2/models/{model}/config", self.config)
        app.router.add_get("/v2/models/{model}/stats", self.stats)
        app.router.add_get("/v2/models/{model}/versions/{version}/stats", self.stats)
        app.router.add_post("/v2/models/{model}/generate", self.generate)
        app.router.add_post("/v2/models/{model}/generate_stream", self.generate_stream)
        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", self.metrics)
        self._runners = [await _serve(app, [http]), await _serve(metrics_app, [metrics])]

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def _error(self, message: str, status: int = 400) -> web.Response:
        return web.json_response({"error": message}, status=status)

    def _unknown(self, model: str) -> web.Response:
        return self._error(f"Request for unknown model: '{model}' is not found")

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def server_metadata(self, request: web.Request) -> web.Response:
        extensions = [
            "classification",
            "sequence",
            "model_repository",
            "model_repository(unload_dependents)",
            "schedule_policy",
            "model_configuration",
            "system_shared_memory",
            "cuda_shared_memory",
            "binary_tensor_data",
            "parameters",
            "statistics",
            "trace",
            "logging",
        ]
        return web.json_response(
            {"name": "triton", "version": TRITON_VERSION, "extensions": extensions}
        )

    async def repository_index(self, request: web.Request) -> web.Response:
        index = [{"name": n, "version": "1", "state": "READY"} for n in TRITON_MODELS]
        return web.json_response(index)

    async def model_ready(self, request: web.Request) -> web.Response:
        known = request.match_info["model"] in TRITON_MODELS
        return web.Response(status=200 if known else 400)

    async def model_metadata(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in TRITON_MODELS:
            return self._unknown(model)
        config = self._config(model)

        def io(t: dict[str, Any]) -> dict[str, Any]:
            return {"name": t["name"], "datatype": t["data_type"][5:], "shape": [-1]}

        return web.json_response(
            {
                "name": model,
                "versions": ["1"],
                "platform": config["platform"] or config["backend"],
                "inputs": [io(t) for t in config["input"]],
                "outputs": [io(t) for t in config["output"]],
            }
        )

    async def config(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in TRITON_MODELS:
            return self._unknown(model)
        return web.json_response(self._config(model))

    def _config(self, model: str) -> dict[str, Any]:
        inputs, outputs = TRITON_IO[model]
        backend = {ENSEMBLE: "", TENSORRT_LLM: "tensorrtllm"}.get(model, "python")
        parameters: dict[str, Any] = {}
        if model == TENSORRT_LLM:
            parameters = {
                "gpt_model_path": {"string_value": f"/engines/{self.llm} (SIMULATED)"},
                "batching_strategy": {"string_value": "inflight_fused_batching"},
                "kv_cache_free_gpu_mem_fraction": {"string_value": "0.9"},
            }
        config: dict[str, Any] = {
            "name": model,
            "platform": "ensemble" if model == ENSEMBLE else "",
            "backend": backend,
            "runtime": "",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": 64,
            "input": [_tensor(*spec) for spec in inputs],
            "output": [_tensor(*spec) for spec in outputs],
            "batch_input": [],
            "batch_output": [],
            "instance_group": [],
            "default_model_filename": "model.py" if backend == "python" else "",
            "cc_model_filenames": {},
            "metric_tags": {},
            "parameters": parameters,
            "model_warmup": [],
            "model_transaction_policy": {"decoupled": model in DECOUPLED},
        }
        if model == ENSEMBLE:
            steps = [PREPROCESSING, TENSORRT_LLM, POSTPROCESSING]
            config["ensemble_scheduling"] = {
                "step": [{"model_name": name, "model_version": -1} for name in steps]
            }
        else:
            config["instance_group"] = [{"name": f"{model}_0", "kind": "KIND_GPU", "count": 1}]
        return config

    # --- statistics, as /v2/models/stats reports them
    def _response_stats(self) -> dict[str, Any]:
        """A streaming model's per-response statistics, as Triton reports them. Built once
        for both decoupled models of a call: a few hundred entries, each its own dict."""
        empty = _duration(0, 0)
        return {
            str(i): {
                "compute_infer": _duration(sent, seconds * 0.98),
                "compute_output": _duration(sent, seconds * 0.02),
                "success": _duration(sent, seconds),
                "fail": empty,
                "empty_response": empty,
                "cancel": empty,
            }
            for i, (sent, seconds) in enumerate(self.workload.responses())
        }

    def _model_stats(self, model: str, responses: dict[str, Any] | None = None) -> dict[str, Any]:
        w = self.workload
        requests = w.requests_total
        failed = w.finished["error"]
        ok = requests - failed
        e2e_total = w.success_s_total
        queue_total = w.queue_s_total
        if model in (PREPROCESSING, POSTPROCESSING):
            # Tokenizing and detokenizing: per request (pre) or per streamed response (post).
            count = requests if model == PREPROCESSING else w.generation_total
            ok, failed, queue_total = count, 0, count * 0.0001
            e2e_total = count * (0.0012 if model == PREPROCESSING else 0.0003)
        infer = max(0.0, e2e_total - queue_total)
        phases = {
            "compute_input": _duration(ok, ok * 0.0002),
            "compute_infer": _duration(ok, infer),
            "compute_output": _duration(ok, ok * 0.0001),
        }
        return {
            "name": model,
            "version": "1",
            "last_inference": int((time.time() - (time.monotonic() - w.last_finish)) * 1000),
            "inference_count": ok + failed,
            "execution_count": ok + failed,
            "inference_stats": {
                "success": _duration(ok, e2e_total),
                "fail": _duration(failed, failed * 0.05),
                "queue": _duration(ok, queue_total),
                **phases,
                "cache_hit": _duration(0, 0),
                "cache_miss": _duration(0, 0),
            },
            "response_stats": (responses or {}) if model in DECOUPLED else {},
            "batch_stats": [{"batch_size": 1, **phases}],
            "memory_usage": [],
        }

    async def stats(self, request: web.Request) -> web.Response:
        model = request.match_info.get("model")
        if model is not None and model not in TRITON_MODELS:
            return self._unknown(model)
        names = [model] if model else list(TRITON_MODELS)
        responses = self._response_stats() if DECOUPLED & set(names) else None
        stats = [self._model_stats(n, responses) for n in names]
        return web.json_response({"model_stats": stats})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.exposition(), content_type="text/plain")

    def exposition(self) -> str:
        """nv_inference_* per model, and the TensorRT-LLM backend's nv_trt_llm_* families."""
        m, w = _Metrics(TRITON_FAMILIES, integers=True), self.workload
        for model in TRITON_MODELS:
            s = self._model_stats(model)["inference_stats"]
            labels = {"model": model, "version": "1"}
            executed = s["success"]["count"] + s["fail"]["count"]
            m.add("nv_inference_request_success", labels, s["success"]["count"])
            for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED"):
                failed = s["fail"]["count"] if reason == "BACKEND" else 0
                m.add("nv_inference_request_failure", {**labels, "reason": reason}, failed)
            m.add("nv_inference_count", labels, executed)
            m.add("nv_inference_exec_count", labels, executed)
            m.add("nv_inference_request_duration_us", labels, s["success"]["ns"] // 1000)
            m.add("nv_inference_queue_duration_us", labels, s["queue"]["ns"] // 1000)
            for phase in ("compute_input", "compute_infer", "compute_output"):
                m.add(f"nv_inference_{phase}_duration_us", labels, s[phase]["ns"] // 1000)
            pending = round(w.waiting) if model == ENSEMBLE else 0
            m.add("nv_inference_pending_request_count", labels, pending)
        trt = {"model": TENSORRT_LLM, "version": "1"}
        batch, waiting = round(w.batch), round(w.waiting)
        for kind, value in (
            ("context", min(batch, 2)),
            ("scheduled", batch),
            ("max", w.traffic.max_seqs),
            ("active", batch),
            ("waiting", waiting),
        ):
            m.add("nv_trt_llm_request_metrics", {**trt, "request_type": kind}, value)
        blocks = w.traffic.kv_tokens // 64
        used = int(blocks * w.kv_usage)
        kv: tuple[tuple[str, float], ...] = (
            ("fraction", w.kv_usage),
            ("tokens_per", 64),
            ("max", blocks),
            ("used", used),
            ("free", blocks - used),
        )
        for block_type, amount in kv:
            labels = {**trt, "kv_cache_block_type": block_type}
            m.add("nv_trt_llm_kv_cache_block_metrics", labels, amount)
        general = "nv_trt_llm_general_metrics"
        m.add(general, {**trt, "general_type": "iteration_counter"}, w.generation_total)
        m.add(general, {**trt, "general_type": "timestamp"}, int(time.time() * 1e6))
        return m.text()

    # --- inference (the generate extension)
    async def _generate_request(self, request: web.Request) -> tuple[Plan, bool] | web.Response:
        model = request.match_info["model"]
        if model not in TRITON_MODELS:
            return self._unknown(model)
        if model != ENSEMBLE:
            return self._error(f"model '{model}' takes token ids; send text to '{ENSEMBLE}'")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return self._error("failed to parse the request JSON buffer")
        if not isinstance(body, dict) or not isinstance(body.get("text_input"), str):
            return self._error(f"expected input 'text_input' (a string) for model '{model}'")
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return self._error(f"expected input 'max_tokens' (an integer >= 1) for '{model}'")
        prompt_tokens = max(1, len(body["text_input"]) // 4)
        now = time.monotonic()
        if CLIENT_MARK in body["text_input"]:  # a demo client's request: it stands for others
            self.workload.arrived(now)
        plan = self.workload.plan(now, prompt_tokens, max_tokens)
        return plan, bool(body.get("stream", False))

    def _response(self, text: str) -> dict[str, Any]:
        return {"model_name": ENSEMBLE, "model_version": "1", "text_output": text}

    async def generate(self, request: web.Request) -> web.Response:
        parsed = await self._generate_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        plan, _ = parsed
        with _Request(self.workload, plan) as req:
            text = "".join([t async for t in req.tokens()])
            req.reason = "length" if req.sent == plan.tokens else "stop"
        return web.json_response(self._response(text))

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        parsed = await self._generate_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        plan, stream = parsed
        with _Request(self.workload, plan) as req:

            async def events() -> AsyncIterator[dict[str, Any] | str]:
                if stream:  # one response per token, as the decoupled ensemble sends them
                    async for token in req.tokens():
                        yield self._response(token)
                else:
                    yield self._response("".join([t async for t in req.tokens()]))
                req.reason = "stop"

            return await _sse(request, events())
