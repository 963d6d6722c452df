"""A SIMULATED vLLM OpenAI server for one model, over real HTTP.

It answers the routes the vLLM plugin reads, with vLLM 0.32's shapes (compare
tests/fixtures/vllm-0.32.0.*), and the inference routes a gateway sends traffic to: OpenAI
completions and chat completions, streamed with SSE when asked. Every number comes from
the engine's `Workload`; its version ends in "-sim", so nothing passes for a real vLLM.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from console.sim.engines import EngineRequest, Exposition, send_sse, serve
from console.sim.load import CLIENT_MARK, FINISH_REASONS, Plan, Workload

VLLM_VERSION = "0.32.0-sim"
MAX_MODEL_LEN = 8192
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
        self._runner = await serve(app, [sock])

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
        w, m = self.workload, Exposition(VLLM_FAMILIES)
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

        with EngineRequest(self.workload, plan) as req:
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

            return await send_sse(request, events())
