"""TEST DOUBLE of `trtllm-serve`: TensorRT-LLM's OpenAI server, with no model behind it.

It answers trtllm-serve's HTTP surface (`/health`, `/version`, `/v1/models`, `/metrics`
with empty iteration stats, the flat OpenAI error shape, uvicorn's "running on" line) and
forwards completions to another OpenAI server (TRTLLM_DOUBLE_UPSTREAM), renaming the model
both ways; TRTLLM_DOUBLE_DRIFT makes its answers disagree from a token on. With
`--backend tensorrt` it checks only that the engine directory looks like one. The whole
double: console/sim/trtllm_double.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

from console.sim.trtllm_double_common import env_float, inject_faults, say, version

# -- serve --------------------------------------------------------------------------------


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trtllm-serve")
    parser.add_argument("model")
    parser.add_argument(
        "--backend", choices=["pytorch", "tensorrt", "_autodeploy"], default="pytorch"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--served_model_name", default=None)
    parser.add_argument("--max_batch_size", type=int, default=None)
    return parser


def engine_problem(model: Path) -> str | None:
    """Why `model` is not an engine directory trtllm-serve --backend tensorrt could load."""
    if not model.is_dir():
        return f"engine directory {model} does not exist"
    try:
        config = json.loads((model / "config.json").read_text())
    except FileNotFoundError:
        return f"{model}/config.json not found: not an engine directory"
    except (OSError, ValueError) as exc:
        return f"cannot read {model}/config.json: {exc}"
    if not isinstance(config, dict) or "version" not in config:
        return f"{model}/config.json has no 'version': a checkpoint, not an engine"
    if not (model / "rank0.engine").is_file():
        return f"{model}/rank0.engine not found"
    return None


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """trtllm-serve's flat OpenAI error shape."""
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


def drift(answer: dict[str, Any], start: int) -> None:
    """Make a completion disagree from token (or, without logprobs, character) `start` on."""
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
            tokens = logprobs["tokens"]
            tokens = tokens[:start] + [" drift"] * max(len(tokens) - start, 0)
            logprobs["tokens"] = tokens
            choice["text"] = "".join(str(t) for t in tokens)
        elif isinstance(choice.get("text"), str) and len(choice["text"]) > start:
            choice["text"] = choice["text"][:start] + " drift"


def rename(data: Any, served: str) -> Any:
    if isinstance(data, dict) and "model" in data:
        data["model"] = served
    return data


def make_app(served: str) -> Any:
    from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

    upstream = (os.environ.get("TRTLLM_DOUBLE_UPSTREAM") or "").rstrip("/")
    upstream_model = os.environ.get("TRTLLM_DOUBLE_UPSTREAM_MODEL")
    drift_raw = os.environ.get("TRTLLM_DOUBLE_DRIFT")
    drift_at = int(drift_raw) if drift_raw else None
    app = web.Application()

    def error(message: str, kind: str, code: int) -> web.Response:
        return web.json_response(error_body(message, kind, code), status=code)

    async def session_ctx(app: web.Application) -> Any:
        # Every request shares one pool, big enough for the drill's 64 concurrent streams.
        async with ClientSession(
            connector=TCPConnector(limit=512),
            timeout=ClientTimeout(total=None, sock_connect=10, sock_read=600),
            read_bufsize=1 << 20,
        ) as session:
            app["session"] = session
            yield

    app.cleanup_ctx.append(session_ctx)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def get_version(_: web.Request) -> web.Response:
        return web.json_response({"version": version()})

    async def models(_: web.Request) -> web.Response:
        card = {"id": served, "object": "model", "owned_by": "tensorrt_llm"}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(_: web.Request) -> web.Response:
        return web.json_response([])

    async def forward(request: web.Request) -> web.StreamResponse:
        if not upstream:
            return error(
                "no model backend (TEST DOUBLE: TRTLLM_DOUBLE_UPSTREAM is not set)",
                "ServiceUnavailableError",
                503,
            )
        try:
            body = await request.json()
        except ValueError:
            return error("request body is not JSON", "BadRequestError", 400)
        if not isinstance(body, dict):
            return error("request body must be a JSON object", "BadRequestError", 400)
        if upstream_model:
            body["model"] = upstream_model
        session: ClientSession = request.app["session"]
        stream: web.StreamResponse | None = None
        try:
            async with session.post(upstream + request.path, json=body) as up:
                if body.get("stream") and up.status == 200:
                    stream = web.StreamResponse(status=up.status)
                    stream.content_type = up.content_type or "text/event-stream"
                    stream.headers["Cache-Control"] = "no-cache"
                    await stream.prepare(request)
                    # Line by line, each written at once: the client sees every event as
                    # the upstream sends it.
                    async for line in up.content:
                        await stream.write(_rename_sse(line, served))
                    await stream.write_eof()
                    return stream
                raw = await up.read()
                try:
                    answer = json.loads(raw)
                except ValueError:
                    return web.Response(status=up.status, body=raw, content_type=up.content_type)
                rename(answer, served)
                if (
                    drift_at is not None
                    and up.status == 200
                    and request.path == "/v1/completions"
                    and isinstance(answer, dict)
                ):
                    drift(answer, drift_at)
                return web.json_response(answer, status=up.status)
        except (ClientError, TimeoutError) as exc:
            if stream is not None:
                raise  # headers are gone: aiohttp drops the connection, the client sees it cut
            return error(f"upstream {upstream}: {exc!r}", "BadGatewayError", 502)

    async def not_found(request: web.Request) -> web.Response:
        return error(f"{request.method} {request.path} not found", "NotFoundError", 404)

    app.router.add_get("/health", health)
    app.router.add_get("/version", get_version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", forward)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def _rename_sse(line: bytes, served: str) -> bytes:
    """One SSE line with its chunk's model renamed; anything else as it came."""
    if not line.startswith(b"data:"):
        return line
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return line
    try:
        chunk = json.loads(payload)
    except ValueError:
        return line
    ending = line[len(line.rstrip(b"\r\n")) :]
    return b"data: " + json.dumps(rename(chunk, served)).encode() + ending


async def serve_async(args: argparse.Namespace) -> int:
    from aiohttp import web

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    served = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
    load_s = env_float("TRTLLM_DOUBLE_LOAD_S", 0.5)
    deadline = loop.time() + load_s
    while (left := deadline - loop.time()) > 0:
        say(f"[TensorRT-LLM][INFO] Loading engine... ({args.model}, backend {args.backend})")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(0.5, left))
        if stop.is_set():
            return 0
    say("[TensorRT-LLM][INFO] Engine loaded (TEST DOUBLE: no model; completions go upstream)")
    runner = web.AppRunner(make_app(served), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as exc:
        say(f"[TensorRT-LLM][ERROR] cannot listen on {args.host}:{args.port}: {exc}")
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1] if runner.addresses else args.port
    say(f"INFO:     Started server process [{os.getpid()}]")
    say("INFO:     Waiting for application startup.")
    say("INFO:     Application startup complete.")
    say(f"INFO:     Uvicorn running on http://{args.host}:{port} (Press CTRL+C to quit)")
    await stop.wait()
    say("INFO:     Shutting down")
    await runner.cleanup()
    say(f"INFO:     Finished server process [{os.getpid()}]")
    return 0


def serve(argv: list[str]) -> int:
    args, _unknown = serve_parser().parse_known_args(argv)
    inject_faults("serve")
    if args.backend == "tensorrt":
        problem = engine_problem(Path(args.model))
        if problem:
            say(f"[TensorRT-LLM] TensorRT-LLM version: {version()}")
            say(f"[TensorRT-LLM][ERROR] {problem}")
            return 1
    return asyncio.run(serve_async(args))
