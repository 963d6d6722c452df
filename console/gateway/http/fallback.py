"""The gateway's aiohttp application: what FrontDoor (console.gateway.http.frontdoor) hands
over, with its connection (the admin API, `/v1/models`, odd requests: chunked uploads,
`Expect`, HTTP/1.0), and the whole gateway where it runs alone (the simulator).

aiohttp has no deadline on a request's body nor on writing an answer: `bounded` gives
every request both (head_timeout_s, write_timeout_s), and max_body_bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from console.gateway.context import GatewayContext
from console.gateway.http.admin import Admin
from console.gateway.http.frontdoor import unsent
from console.gateway.http.sink import (
    SERVED_BY,
    SSE_HEADERS,
    ClientGone,
    ClientStalled,
    Sink,
    error_body,
    send_error,
)


def openai_error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    body = error_body(message, kind, code)
    return web.Response(body=body, status=status, content_type="application/json")


class _SseResponse(web.StreamResponse):
    _send_headers_immediately = False  # the head goes out with the first chunk


class AiohttpSink(Sink):
    """An answer through aiohttp: a whole answer is written by `bounded`, under
    write_timeout_s; a stream here, chunk by chunk under the same deadline."""

    def __init__(self, request: web.Request, write_timeout: float) -> None:
        self.request = request
        self.write_timeout = write_timeout
        self.response: web.StreamResponse = web.Response(status=500)

    async def reply(
        self, status: int, body: bytes, content_type: str, served_by: str | None
    ) -> None:
        headers = {"Content-Type": content_type}
        if served_by is not None:
            headers[SERVED_BY] = served_by
        self.response = web.Response(body=body, status=status, headers=headers)

    async def open_stream(self, served_by: str) -> None:
        self.response = _SseResponse(status=200, headers={**SSE_HEADERS, SERVED_BY: served_by})
        await self.response.prepare(self.request)

    async def write(self, chunk: bytes) -> None:
        try:
            await _within(self.request, self.write_timeout, self.response.write(chunk))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            raise ClientGone from None

    async def close_stream(self) -> None:
        try:
            await _within(self.request, self.write_timeout, self.response.write_eof())
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            raise ClientGone from None


async def _within(request: web.BaseRequest, timeout: float, write: Awaitable[None]) -> None:
    """Await an aiohttp write; ClientStalled, with the connection cut, when the client takes
    no byte of what waits to be sent for `timeout` seconds (aiohttp waits forever)."""
    task = asyncio.ensure_future(write)
    await asyncio.sleep(0)  # the task's first step: its bytes handed to the transport
    transport = request.transport
    left = -1 if transport is None else unsent(transport)
    while True:
        done, _ = await asyncio.wait([task], timeout=timeout)
        if done:
            return task.result()
        now = -1 if transport is None else unsent(transport)
        if now >= left:
            task.cancel()
            if transport is not None:
                transport.abort()
            raise ClientStalled
        left = now


def build_app(gw: GatewayContext) -> web.Application:
    """The aiohttp application of `gw`; it starts and closes the gateway with it."""
    settings = gw.settings

    @web.middleware
    async def bounded(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every request: its body in within head_timeout_s and max_body_bytes, and a whole
        answer written within write_timeout_s."""
        if request.body_exists:
            try:
                async with asyncio.timeout(settings.head_timeout_s):
                    await request.read()  # kept by aiohttp for the handler
            except TimeoutError:
                late = (
                    f"the request body did not come within head_timeout_s "
                    f"({settings.head_timeout_s:g} s)"
                )
                return _closing(openai_error(408, late, "invalid_request_error"))
            except web.HTTPRequestEntityTooLarge:
                big = f"request body over {settings.max_body_bytes} bytes (max_body_bytes)"
                return _closing(openai_error(413, big, "invalid_request_error"))
        response = await handler(request)
        if not response.prepared:
            try:
                await _within(request, settings.write_timeout_s, _write(response, request))
            except ClientStalled as stalled:
                gw.relay.client_left(stalled, AiohttpSink(request, 0))
        return response

    async def models_list(request: web.Request) -> web.Response:
        if not gw.client_ok(request.headers.get("Authorization")):
            return openai_error(401, "invalid API key", "invalid_request_error", "invalid_api_key")
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "engineroom"}
            for name in gw.table.models
        ]
        return web.json_response({"object": "list", "data": data})

    def completion(chat: bool) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            sink = AiohttpSink(request, settings.write_timeout_s)
            if not gw.client_ok(request.headers.get("Authorization")):
                await send_error(
                    sink, 401, "invalid API key", "invalid_request_error", "invalid_api_key"
                )
                return sink.response
            await gw.relay.answer(await request.read(), chat, sink)  # read by `bounded`
            return sink.response

        return handle

    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[bounded])
    app.router.add_post("/v1/completions", completion(chat=False))
    app.router.add_post("/v1/chat/completions", completion(chat=True))
    app.router.add_get("/v1/models", models_list)
    app.router.add_get("/healthz", _ok)
    Admin(gw).add_routes(app)

    async def lifecycle(_: web.Application) -> Any:
        await gw.start()
        yield
        await gw.close()

    app.cleanup_ctx.append(lifecycle)
    return app


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _write(response: web.StreamResponse, request: web.Request) -> None:
    await response.prepare(request)
    await response.write_eof()


def _closing(response: web.Response) -> web.Response:
    response.force_close()  # what is left of the request is never read
    return response
