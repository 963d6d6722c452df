"""ENGINE DOUBLES for the gateway's fuzz test and soak: one vLLM-shaped or Triton-shaped
upstream per listener, answering at once or streaming at a set pace.

    python tests/engine_double.py vllm:PORT [triton:PORT ...] [--chunks N] [--delay S]
                                  [--chunk-bytes B]

The gateway's tests against real vLLM and Triton are tests/test_gateway.py. These stand
in where a real engine cannot keep up: thousands of fuzzed requests in under a minute,
and an engine killed with -9 and restarted every minute for ten (a real vLLM takes a
minute to load here). They speak the same routes and shapes the gateway uses:

- vllm: `GET /health`, `GET /v1/models`, `POST /v1/completions` and
  `/v1/chat/completions`: 400 on a body that is not a JSON object, 404 on an unknown model,
  else N chunks of SSE (`stream: true`) or one JSON answer.
- triton: `GET /v2/health/ready`, `GET /v2/models/{m}/ready`, `POST
  /v2/models/{m}/generate` and `generate_stream`: 400 without `text_input` or a positive
  `max_tokens`, else `text_output` events.

Prints `listening` once every listener is up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from aiohttp import web

MODEL = "tiny"
ENSEMBLE = "ensemble"


class Pace:
    def __init__(self, chunks: int, delay: float, chunk_bytes: int = 0) -> None:
        self.chunks, self.delay = chunks, delay
        self.text = " tok" + "x" * max(0, chunk_bytes - 4)  # each chunk's token text

    async def stream(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i, event in enumerate(events):
                if i and self.delay:
                    await asyncio.sleep(self.delay)
                await resp.write(b"data: " + event + b"\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the gateway closed the connection: its client went away
        return resp


async def _object(request: web.Request) -> dict | None:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "BadRequestError"}}, status=status
    )


def vllm_app(pace: Pace) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await _object(request)
        if body is None:
            return _error(400, "the request body must be a JSON object")
        if body.get("model") != MODEL:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        chat = request.path.endswith("/chat/completions")
        choice = {"index": 0, "finish_reason": None}
        choice.update({"delta": {"content": pace.text}} if chat else {"text": pace.text})
        chunk = json.dumps({"id": "cmpl-double", "object": "x", "model": MODEL,
                            "choices": [choice]}).encode()  # fmt: skip
        if body.get("stream") is True:
            return await pace.stream(request, [chunk] * pace.chunks + [b"[DONE]"])
        return web.json_response({"id": "cmpl-double", "model": MODEL, "choices": [choice]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    return app


def triton_app(pace: Pace) -> web.Application:
    async def ready(request: web.Request) -> web.Response:
        model = request.match_info.get("model", ENSEMBLE)
        return web.Response(status=200 if model == ENSEMBLE else 400)

    async def generate(request: web.Request) -> web.StreamResponse:
        if request.match_info["model"] != ENSEMBLE:
            return web.json_response({"error": "unknown model"}, status=400)
        body = await _object(request)
        if body is None or not isinstance(body.get("text_input"), str):
            return web.json_response({"error": "expected input 'text_input'"}, status=400)
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return web.json_response({"error": "expected input 'max_tokens'"}, status=400)
        event = json.dumps({"model_name": ENSEMBLE, "text_output": pace.text}).encode()
        if request.path.endswith("_stream"):
            return await pace.stream(request, [event] * min(max_tokens, pace.chunks))
        return web.json_response({"model_name": ENSEMBLE, "text_output": " tok"})

    app = web.Application()
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2/models/{model}/ready", ready)
    app.router.add_post("/v2/models/{model}/generate", generate)
    app.router.add_post("/v2/models/{model}/generate_stream", generate)
    return app


async def serve(listeners: list[tuple[str, int]], pace: Pace) -> None:
    runners = []
    for kind, port in listeners:
        app = vllm_app(pace) if kind == "vllm" else triton_app(pace)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
        runners.append(runner)
    print("listening", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("listeners", nargs="+", help="vllm:PORT or triton:PORT")
    parser.add_argument("--chunks", type=int, default=8, help="SSE chunks per streamed answer")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--chunk-bytes", type=int, default=0, help="pad each chunk's text")
    args = parser.parse_args()
    listeners = []
    for spec in args.listeners:
        kind, _, port = spec.partition(":")
        if kind not in ("vllm", "triton") or not port.isdigit():
            parser.error(f"{spec!r}: wants vllm:PORT or triton:PORT")
        listeners.append((kind, int(port)))
    asyncio.run(serve(listeners, Pace(args.chunks, args.delay, args.chunk_bytes)))


if __name__ == "__main__":
    main()
