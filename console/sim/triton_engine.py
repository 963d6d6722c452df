"""A SIMULATED Triton server for one LLM built with TensorRT-LLM, over real HTTP.

The usual four-model repository (ensemble, preprocessing, tensorrt_llm, postprocessing):
the routes the Triton plugin reads, with Triton 2.51's and the TensorRT-LLM backend's
shapes (compare tests/fixtures/triton-2.51.0.* and triton-trtllm-backend.metrics.txt),
and the `generate` and `generate_stream` routes a gateway sends traffic to. Every number
comes from the engine's `Workload`; its version ends in "-sim", so nothing passes for a
real Triton.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from console.sim.engines import EngineRequest, Exposition, send_sse, serve
from console.sim.load import CLIENT_MARK, Plan, Workload

TRITON_VERSION = "2.51.0-sim"

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
        self._runners = [await serve(app, [http]), await serve(metrics_app, [metrics])]

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
        m, w = Exposition(TRITON_FAMILIES, integers=True), self.workload
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
        with EngineRequest(self.workload, plan) as req:
            text = "".join([t async for t in req.tokens()])
            req.reason = "length" if req.sent == plan.tokens else "stop"
        return web.json_response(self._response(text))

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        parsed = await self._generate_request(request)
        if isinstance(parsed, web.Response):
            return parsed
        plan, stream = parsed
        with EngineRequest(self.workload, plan) as req:

            async def events() -> AsyncIterator[dict[str, Any] | str]:
                if stream:  # one response per token, as the decoupled ensemble sends them
                    async for token in req.tokens():
                        yield self._response(token)
                else:
                    yield self._response("".join([t async for t in req.tokens()]))
                req.reason = "stop"

            return await send_sse(request, events())
