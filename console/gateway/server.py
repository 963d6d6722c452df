"""The gateway: one OpenAI-compatible front door for every engine of the fleet.

    engineroom gateway --fleet fleet.toml [--listen HOST:PORT]

Front door: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`. A
request is routed by its model name across that model's deployments, by the live
weights; streams are passed through chunk by chunk as they arrive. Triton deployments
get OpenAI <-> generate/generate_stream translation (console.gateway.triton_openai).

Data path: FrontDoor (console.gateway.frontdoor) serves the two completion routes itself
and hands any other request, with its connection, to aiohttp, which serves the rest (the
admin API, `/v1/models`, odd requests; also `Gateway.app()` on its own, as the simulator
runs it). Upstream, each deployment keeps a pool of kept-alive connections of a small
httptools client (console.gateway.upstream.Pool). The body is forwarded as the bytes that
came in (parsed once, for the model and `stream`; rewritten only when the engine's model
name differs), and each upstream chunk is written out as soon as it is read, never
parsed. aiohttp's server and client together cost ~0.5 ms of Python per request on
loopback; this path ~0.1 ms (bench/gateway_overhead.py, docs/gateway.md).

A request that failed before any byte reached the client (refused connection, 5xx) is
retried once on another routable deployment. A stream that already sent bytes is never
replayed: if its engine dies, the client gets an error event and the stream ends.

Admin API (admin token): routes, weights, failover jobs, the measurement snapshot, the
audit log and Prometheus `/metrics`. DESIGN.md (Gateway) is the contract.

Bounds (docs/security.md): request bodies (`max_body_bytes`) and engines' whole
answers (`max_response_bytes`, else 502) are capped; a stream is read from the engine only
as fast as the client takes it, and a client that takes nothing for `write_timeout_s` is
cut; a request must come within `head_timeout_s`; `max_connections` caps connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import random
import resource
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from console.core.config import Fleet, Model, load_fleet
from console.gateway import triton_openai as tri
from console.gateway.failover import FailoverRefused, Failovers
from console.gateway.frontdoor import (
    SERVED_BY,
    SHUTDOWN_GRACE_S,
    SSE_HEADERS,
    ClientGone,
    ClientStalled,
    FrontDoor,
    Sink,
    error_body,
    send_error,
    unsent,
)
from console.gateway.measure import exposition
from console.gateway.routes import FleetFileChanged, GatewayStore, save_to_fleet
from console.gateway.upstream import (
    Answer,
    AnswerTooLarge,
    Upstream,
    UpstreamError,
    build_upstreams,
    health_loop,
)

log = logging.getLogger(__name__)


class NotStarted(Exception):
    """The upstream failed before the client got a byte: safe to try another deployment."""


class BadAnswer(Exception):
    """The engine's answer is not passed on (over a cap): a 502, not retried elsewhere."""


def openai_error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    body = error_body(message, kind, code)
    return web.Response(body=body, status=status, content_type="application/json")


_error = send_error


class _SseResponse(web.StreamResponse):
    _send_headers_immediately = False  # the head goes out with the first chunk


class AiohttpSink(Sink):
    """An answer through aiohttp (a connection FrontDoor handed over, or the simulator's
    gateway): a whole answer is written by Gateway.bounded, under write_timeout_s."""

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


class Gateway:
    def __init__(
        self,
        fleet: Fleet,
        *,
        admin_token: str,
        api_keys: list[str] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        assert fleet.gateway is not None, "the fleet file has no [gateway] section"
        self.fleet = fleet
        self.settings = fleet.gateway
        self.admin_token = admin_token.encode()
        self.api_keys = [k.encode() for k in api_keys or []]
        root = state_dir or Path(self.settings.state_dir).expanduser()
        self.store = GatewayStore(root / "gateway.sqlite")
        self.models: dict[str, Model] = {m.name: m for m in fleet.models}
        self.upstreams: dict[str, list[Upstream]] = build_upstreams(
            fleet.models, self.settings.window_s
        )
        self.weights = self._initial_weights()
        self.http: aiohttp.ClientSession | None = None
        self.failovers = Failovers(self)
        self._tasks: list[asyncio.Task[None]] = []
        self.front_doors: set[FrontDoor] = set()  # FrontDoor's connections, for shutdown
        # Client connections open, FrontDoor's and those handed to aiohttp (run_gateway).
        self.open_connections: Callable[[], int] = lambda: len(self.front_doors)
        self.clients_gone = 0  # hung up before their answer was complete
        self.clients_stalled = 0  # read nothing for write_timeout_s, and were cut
        self.connections_refused = 0  # over max_connections
        self._cap_logged = -3600.0  # when the connection cap was last logged (monotonic)

    # -- routes ------------------------------------------------------------------------

    def _initial_weights(self) -> dict[str, dict[str, int]]:
        stored = self.store.weights()
        weights = {}
        for name, model in self.models.items():
            mine = stored.get(name, {})
            weights[name] = {d.id: mine.get(d.id, d.weight) for d in model.deployments}
        return weights

    def upstream(self, model: str, deployment: str) -> Upstream | None:
        return next((u for u in self.upstreams.get(model, []) if u.id == deployment), None)

    def pick(self, model: str, exclude: list[str]) -> Upstream | None:
        """A deployment for one request: weighted among the healthy ones with weight;
        with auto_failover, any healthy one when those are all gone."""
        weights = self.weights.get(model, {})
        pool = [
            u
            for u in self.upstreams.get(model, [])
            if u.up and u.id not in exclude and weights.get(u.id, 0) > 0
        ]
        if pool:
            if len(pool) == 1:
                return pool[0]
            return random.choices(pool, [weights[u.id] for u in pool])[0]
        if self.models[model].auto_failover:
            spare = [u for u in self.upstreams.get(model, []) if u.up and u.id not in exclude]
            return spare[0] if spare else None
        return None

    def set_weights(self, model: str, weights: dict[str, int], who: str, why: str) -> None:
        before = dict(self.weights[model])
        self.store.set_weights(model, weights, who, why, before)  # durable first
        self.weights[model] = {**before, **weights}

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self.settings.connect_timeout_s,
                sock_read=self.settings.read_timeout_s,
            ),
            auto_decompress=False,
            trust_env=False,
        )
        self.failovers.settle_interrupted()
        self._tasks.append(
            asyncio.create_task(
                health_loop(
                    self.http,
                    lambda: [u for ups in self.upstreams.values() for u in ups],
                    self.settings.health_interval_s,
                    min(2.0, self.settings.health_interval_s * 2),
                    self._health_changed,
                ),
                name="health",
            )
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.failovers.close()
        for ups in self.upstreams.values():
            for up in ups:
                up.pool.close()
        if self.http is not None:
            await self.http.close()
        self.store.close()

    async def drain_front_doors(self, grace: float) -> None:
        """Shutdown: idle connections close now, answers in flight get `grace` seconds."""
        deadline = time.monotonic() + grace
        while True:
            for door in list(self.front_doors):
                if door.task is None and door.transport is not None:
                    door.transport.close()
            if not self.front_doors or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        for door in list(self.front_doors):
            if door.transport is not None:
                door.transport.abort()

    def reload(self, fleet: Fleet) -> list[str]:
        """A new fleet.toml (SIGHUP): deployments added or removed; in-flight requests keep
        the upstream they hold. Stored weights stay; new deployments take the file's."""
        changes = []
        old = self.upstreams
        fresh = build_upstreams(fleet.models, self.settings.window_s)
        for name, ups in fresh.items():
            kept = {u.id: u for u in old.get(name, [])}
            merged = []
            for u in ups:
                if u.id in kept:
                    kept[u.id].dep = u.dep
                    merged.append(kept[u.id])
                else:
                    merged.append(u)
                    changes.append(f"added {name}/{u.id}")
            fresh[name] = merged
            for gone in set(kept) - {u.id for u in ups}:
                changes.append(f"removed {name}/{gone}")
        self.fleet = fleet
        self.models = {m.name: m for m in fleet.models}
        self.upstreams = fresh
        stored = self.store.weights()
        self.weights = {
            name: {
                d.id: self.weights.get(name, {}).get(d.id, stored.get(name, {}).get(d.id, d.weight))
                for d in model.deployments
            }
            for name, model in self.models.items()
        }
        self.store.audit("gateway", "fleet reloaded", {"changes": changes})
        return changes

    def _health_changed(self, upstream: Upstream) -> None:
        if not upstream.up:
            self.failovers.maybe_auto(upstream)

    # -- front door --------------------------------------------------------------------

    def client_ok(self, header: str | None) -> bool:
        if not self.api_keys:
            return True
        key = (header or "").removeprefix("Bearer ").strip().encode()
        found = False
        for allowed in self.api_keys:  # every key compared: no early exit on a match
            found |= hmac.compare_digest(key, allowed)
        return found

    async def models_list(self, request: web.Request) -> web.Response:
        if not self.client_ok(request.headers.get("Authorization")):
            return openai_error(401, "invalid API key", "invalid_request_error", "invalid_api_key")
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "engineroom"}
            for name in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._front(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._front(request, chat=True)

    async def _front(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """The front door as an aiohttp handler (connections FrontDoor handed over); the
        body was read by `bounded`."""
        sink = AiohttpSink(request, self.settings.write_timeout_s)
        if not self.client_ok(request.headers.get("Authorization")):
            await _error(sink, 401, "invalid API key", "invalid_request_error", "invalid_api_key")
            return sink.response
        await self.answer(await request.read(), chat, sink)
        return sink.response

    @web.middleware
    async def bounded(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every aiohttp request: its body in within head_timeout_s and max_body_bytes, and
        a whole answer written within write_timeout_s (aiohttp has neither deadline)."""
        if request.body_exists:
            try:
                async with asyncio.timeout(self.settings.head_timeout_s):
                    await request.read()  # kept by aiohttp for the handler
            except TimeoutError:
                limit = self.settings.head_timeout_s
                late = f"the request body did not come within head_timeout_s ({limit:g} s)"
                return _closing(openai_error(408, late, "invalid_request_error"))
            except web.HTTPRequestEntityTooLarge:
                big = f"request body over {self.settings.max_body_bytes} bytes (max_body_bytes)"
                return _closing(openai_error(413, big, "invalid_request_error"))
        response = await handler(request)
        if not response.prepared:
            try:
                await _within(request, self.settings.write_timeout_s, _write(response, request))
            except ClientStalled as stalled:
                self.client_left(stalled, AiohttpSink(request, 0))
        return response

    async def answer(self, body: bytes, chat: bool, sink: Sink) -> None:
        """One completion (chat or not) from an authorized client, answered into `sink`. A
        client that leaves before the end is counted and logged, not failed on."""
        try:
            await self._answer(body, chat, sink)
        except ClientGone as gone:
            self.client_left(gone, sink)

    def client_left(self, gone: ClientGone, sink: Sink) -> None:
        up = sink.upstream
        where = "the gateway" if up is None else f"{up.model}/{up.id}"
        if isinstance(gone, ClientStalled):
            self.clients_stalled += 1
            log.warning(
                "a client stopped reading for %g s (write_timeout_s): its answer from %s "
                "was cut", self.settings.write_timeout_s, where,
            )  # fmt: skip
        else:
            self.clients_gone += 1
            log.warning("a client went away before its answer from %s was complete", where)

    def connection_refused(self) -> None:
        """A connection over max_connections: counted; logged at most once a minute."""
        self.connections_refused += 1
        now = time.monotonic()
        if now - self._cap_logged >= 60:
            self._cap_logged = now
            log.warning(
                "max_connections (%d) reached: new connections get 503 until some close "
                "(%d refused so far)", self.settings.max_connections, self.connections_refused,
            )  # fmt: skip

    async def _answer(self, body: bytes, chat: bool, sink: Sink) -> None:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            return await _error(sink, 400, f"the body is not JSON: {exc}", "invalid_request_error")
        if not isinstance(data, dict):
            return await _error(
                sink, 400, "the body must be a JSON object", "invalid_request_error"
            )
        model = data.get("model")
        if not isinstance(model, str) or model not in self.models:
            return await _error(
                sink,
                404,
                f"the model {model!r} does not exist (models: {', '.join(self.models)})",
                "invalid_request_error",
                "model_not_found",
            )
        stream = data.get("stream") is True
        tried: list[str] = []
        why = "no healthy deployment has weight"
        for _ in range(2):  # the first choice, then one retry elsewhere
            upstream = self.pick(model, tried)
            if upstream is None:
                break
            tried.append(upstream.id)
            sink.upstream = upstream
            try:
                return await self._forward(sink, upstream, data, body, chat, stream)
            except NotStarted as exc:
                why = f"{upstream.id}: {exc}"
            except BadAnswer as exc:
                return await _error(sink, 502, f"{upstream.id}: {exc}", "server_error")
            except tri.BadRequest as exc:
                return await _error(sink, 400, str(exc), "invalid_request_error")
        await _error(sink, 503, f"no deployment of {model} could answer ({why})", "server_error")

    async def _forward(
        self,
        sink: Sink,
        up: Upstream,
        data: dict[str, Any],
        body: bytes,
        chat: bool,
        stream: bool,
    ) -> None:
        up.inflight += 1
        try:
            if up.kind == "triton":
                return await self._triton(sink, up, data, chat, stream)
            if data["model"] != up.engine_model:
                body = json.dumps({**data, "model": up.engine_model}).encode()
            path = "/v1/chat/completions" if chat else "/v1/completions"
            return await self._pass_through(sink, up, path, body, stream)
        finally:
            up.inflight -= 1

    async def _open(self, up: Upstream, path: str, body: bytes) -> Answer:
        """POST upstream; any failure here is before the client saw a byte."""
        try:
            return await up.pool.post(
                path, body, self.settings.connect_timeout_s, self.settings.read_timeout_s
            )
        except AnswerTooLarge as exc:
            up.measures.outcomes.add(False)
            raise BadAnswer(str(exc)) from None
        except UpstreamError as exc:  # refused, reset or closed before an answer
            up.measures.outcomes.add(False)
            if up.mark_down(f"connection failed: {exc}"):
                self.failovers.maybe_auto(up)
            raise NotStarted("connection failed") from None
        except TimeoutError:
            up.measures.outcomes.add(False)
            raise NotStarted("no answer within read_timeout_s") from None

    async def _read(self, up: Upstream, ans: Answer) -> bytes:
        """A whole answer; a failure while reading it is still before the client's first
        byte, so another deployment may answer."""
        try:
            payload = await ans.read(self.settings.max_response_bytes)
        except AnswerTooLarge as exc:
            up.measures.outcomes.add(False)
            raise BadAnswer(f"{exc} (max_response_bytes)") from None
        except (UpstreamError, TimeoutError) as exc:
            up.measures.outcomes.add(False)
            raise NotStarted(f"the answer was cut: {exc}") from None
        if ans.status >= 500:
            up.measures.outcomes.add(False)
            if up.server_error(ans.status):
                self.failovers.maybe_auto(up)
            text = payload[:200].decode(errors="replace")
            raise NotStarted(f"HTTP {ans.status}: {text}")
        return payload

    async def _pass_through(
        self, sink: Sink, up: Upstream, path: str, body: bytes, stream: bool
    ) -> None:
        started = time.perf_counter()
        ans = await self._open(up, path, body)
        try:
            if not stream or ans.status != 200:
                payload = await self._read(up, ans)
                up.measures.e2e.add(time.perf_counter() - started)
                up.measures.outcomes.add(True)
                content_type = ans.content_type or "application/json"
                return await sink.reply(ans.status, payload, content_type, up.id)
            await sink.open_stream(up.id)
            await self._relay(sink, up, ans.chunks(), started, None)
        finally:
            up.pool.release(ans)

    async def _relay(
        self,
        sink: Sink,
        up: Upstream,
        chunks: AsyncIterator[bytes],
        started: float,
        shaper: tri.Shaper | None,
    ) -> bool | None:
        """Copy upstream chunks to the client as they come; measure TTFT and gaps.

        Chunks are passed as read, never parsed (an SSE chunk is usually one token).
        Returns True when the upstream finished, False when it was cut (the client got an
        error event); ClientGone when the client went away (not the deployment's failure)."""
        ttft, itl = up.measures.ttft, up.measures.itl
        last = started
        first = True
        try:
            async for chunk in chunks:
                if shaper is not None:
                    chunk = _triton_chunk(shaper, chunk)
                    if not chunk:
                        continue
                now = time.perf_counter()
                if first:
                    ttft.add(now - started)
                    first = False
                else:
                    itl.add(now - last)
                last = now
                await sink.write(chunk)
            if shaper is not None:
                await sink.write(shaper.last())
        except (UpstreamError, TimeoutError, tri.BadRequest) as exc:
            up.measures.outcomes.add(False)
            why = str(exc) or exc.__class__.__name__
            event = {
                "error": {
                    "message": f"the engine ({up.id}) stopped mid-answer: {why}",
                    "type": "server_error",
                }
            }
            with contextlib.suppress(ClientGone):  # and the stream ends, for the client
                await sink.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                await sink.close_stream()
            return False
        up.measures.e2e.add(time.perf_counter() - started)
        up.measures.outcomes.add(True)
        with contextlib.suppress(ClientGone):
            await sink.close_stream()
        return True

    async def _triton(
        self, sink: Sink, up: Upstream, data: dict[str, Any], chat: bool, stream: bool
    ) -> None:
        path, tbody = tri.request(data, chat, up.dep, up.engine_model)
        shaper = tri.Shaper(chat, up.model, tbody["max_tokens"])
        started = time.perf_counter()
        ans = await self._open(up, path, json.dumps(tbody).encode())
        try:
            if ans.status != 200:
                text = (await self._read(up, ans)).decode(errors="replace")
                up.measures.outcomes.add(True)  # a client error, not the deployment's
                message = text
                with contextlib.suppress(ValueError, AttributeError):
                    message = str(json.loads(text).get("error", text))
                return await _error(sink, ans.status, message[:500], "invalid_request_error")
            if not stream:
                text = tri.text_of(await self._read(up, ans))
                up.measures.e2e.add(time.perf_counter() - started)
                up.measures.outcomes.add(True)
                payload = json.dumps(shaper.response(text)).encode()
                return await sink.reply(200, payload, "application/json", up.id)
            await sink.open_stream(up.id)
            events = _sse_events(ans.chunks(), self.settings.max_response_bytes)
            await self._relay(sink, up, events, started, shaper)
        finally:
            up.pool.release(ans)

    # -- admin -------------------------------------------------------------------------

    def admin(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        async def guarded(request: web.Request) -> web.StreamResponse:
            header = request.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                return web.json_response({"error": "missing bearer token"}, status=401)
            if not hmac.compare_digest(header[7:].strip().encode(), self.admin_token):
                return web.json_response({"error": "invalid token"}, status=401)
            return await handler(request)

        return guarded

    def routes_view(self) -> dict[str, Any]:
        out = {}
        for name, ups in self.upstreams.items():
            out[name] = {
                "auto_failover": self.models[name].auto_failover,
                "failover_job": self.failovers.running.get(name),
                "deployments": [
                    {
                        "id": u.id,
                        "engine": u.kind,
                        "node": u.dep.node,
                        "endpoint": u.dep.endpoint,
                        "weight": self.weights[name].get(u.id, 0),
                        "up": u.up,
                        "reason": u.reason,
                        "inflight": u.inflight,
                    }
                    for u in ups
                ],
            }
        return out

    async def get_routes(self, request: web.Request) -> web.Response:
        return web.json_response(self.routes_view())

    async def put_routes(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in self.models:
            return web.json_response({"error": f"no model {model!r}"}, status=404)
        try:
            body = await request.json()
            weights = body["weights"]
            why = str(body.get("why") or "")
        except (ValueError, KeyError, TypeError, RecursionError):
            return web.json_response(
                {"error": 'wants {"weights": {ID: N}, "why": ...}'}, status=422
            )
        known = {u.id for u in self.upstreams[model]}
        if not isinstance(weights, dict) or not weights:
            return web.json_response({"error": "weights: wants {deployment: weight}"}, status=422)
        for dep, weight in weights.items():
            if dep not in known:
                return _refuse(422, f"no deployment {dep!r} of {model}")
            if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
                return web.json_response(
                    {"error": f"{dep}: weight wants an integer >= 0"}, status=422
                )
        if (job := self.failovers.running.get(model)) is not None:
            message = f"a failover of {model} is running (job {job}); cancel it first"
            return web.json_response({"error": message}, status=409)
        self.set_weights(model, weights, "admin", why or "set by the admin API")
        return web.json_response(self.routes_view()[model])

    async def save_routes(self, request: web.Request) -> web.Response:
        try:
            changed = await asyncio.to_thread(save_to_fleet, self.fleet, self.weights)
        except FleetFileChanged as exc:  # a hand edit since the load: never overwritten
            return _refuse(409, str(exc))
        self.store.audit("admin", "routes saved to fleet.toml", {"changed": changed})
        return web.json_response({"path": str(self.fleet.source), "changed": changed})

    async def post_failover(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if body is None:
            return _refuse(400, 'the body must be a JSON object: {"model": ..., "to": ...}')
        try:
            job = self.failovers.start(
                str(body.get("model")),
                str(body.get("to")),
                str(body.get("mode", "planned")),
                who="admin",
                why=str(body.get("why") or ""),
            )
        except FailoverRefused as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        return web.json_response(job, status=202)

    async def plan_failover(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if body is None:
            return _refuse(400, 'the body must be a JSON object: {"model": ..., "to": ...}')
        try:
            result = await self.failovers.plan(str(body.get("model")), str(body.get("to")))
        except FailoverRefused as exc:
            return _refuse(exc.status, str(exc))
        return web.json_response(result)

    async def get_job(self, request: web.Request) -> web.Response:
        job = self.failovers.job(request.match_info["id"])
        if job is None:
            return web.json_response({"error": "no such job"}, status=404)
        return web.json_response(job)

    async def list_jobs(self, request: web.Request) -> web.Response:
        return web.json_response(self.failovers.jobs())

    async def cancel_job(self, request: web.Request) -> web.Response:
        try:
            job = await self.failovers.cancel(request.match_info["id"])
        except FailoverRefused as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        return web.json_response(job)

    async def snapshot(self, request: web.Request) -> web.Response:
        out: dict[str, Any] = {"time": time.time(), "models": {}}
        for name, ups in self.upstreams.items():
            out["models"][name] = {
                u.id: {
                    "weight": self.weights[name].get(u.id, 0),
                    "up": u.up,
                    "reason": u.reason,
                    "inflight": u.inflight,
                    **u.measures.summary(),
                }
                for u in ups
            }
        return web.json_response(out)

    async def audit(self, request: web.Request) -> web.Response:
        return web.json_response(self.store.audit_log(200))

    async def metrics(self, request: web.Request) -> web.Response:
        lines = [
            "# TYPE engineroom_gateway_connections gauge",
            "# TYPE engineroom_gateway_connections_refused_total counter",
            "# TYPE engineroom_gateway_client_gone_total counter",
            "# TYPE engineroom_gateway_client_stalled_total counter",
            f"engineroom_gateway_connections {self.open_connections()}",
            f"engineroom_gateway_connections_refused_total {self.connections_refused}",
            f"engineroom_gateway_client_gone_total {self.clients_gone}",
            f"engineroom_gateway_client_stalled_total {self.clients_stalled}",
            "# TYPE engineroom_gateway_health_checks_total counter",
            "# TYPE engineroom_gateway_inflight gauge",
            "# TYPE engineroom_gateway_weight gauge",
            "# TYPE engineroom_gateway_up gauge",
            "# TYPE engineroom_gateway_requests_total counter",
            "# TYPE engineroom_gateway_failures_total counter",
            "# TYPE engineroom_gateway_ttft_seconds histogram",
            "# TYPE engineroom_gateway_itl_seconds histogram",
            "# TYPE engineroom_gateway_e2e_seconds histogram",
        ]
        for name, ups in self.upstreams.items():
            for u in ups:
                labels = f'model="{name}",deployment="{u.id}",engine="{u.kind}"'
                m = u.measures
                lines += [
                    f"engineroom_gateway_inflight{{{labels}}} {u.inflight}",
                    f"engineroom_gateway_weight{{{labels}}} {self.weights[name].get(u.id, 0)}",
                    f"engineroom_gateway_up{{{labels}}} {int(u.up)}",
                    f"engineroom_gateway_health_checks_total{{{labels}}} {u.checks}",
                    f"engineroom_gateway_requests_total{{{labels}}} "
                    f"{m.outcomes.ok_total + m.outcomes.failed_total}",
                    f"engineroom_gateway_failures_total{{{labels}}} {m.outcomes.failed_total}",
                    *exposition("engineroom_gateway_ttft_seconds", labels, m.ttft),
                    *exposition("engineroom_gateway_itl_seconds", labels, m.itl),
                    *exposition("engineroom_gateway_e2e_seconds", labels, m.e2e),
                ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.settings.max_body_bytes, middlewares=[self.bounded]
        )
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models_list)
        app.router.add_get("/healthz", lambda r: _ok())
        app.router.add_get("/admin/routes", self.admin(self.get_routes))
        app.router.add_put("/admin/routes/{model}", self.admin(self.put_routes))
        app.router.add_post("/admin/routes/save", self.admin(self.save_routes))
        app.router.add_post("/admin/failover", self.admin(self.post_failover))
        app.router.add_post("/admin/failover/plan", self.admin(self.plan_failover))
        app.router.add_get("/admin/jobs", self.admin(self.list_jobs))
        app.router.add_get("/admin/jobs/{id}", self.admin(self.get_job))
        app.router.add_delete("/admin/jobs/{id}", self.admin(self.cancel_job))
        app.router.add_get("/admin/snapshot", self.admin(self.snapshot))
        app.router.add_get("/admin/audit", self.admin(self.audit))
        app.router.add_get("/metrics", self.admin(self.metrics))

        async def lifecycle(_: web.Application) -> Any:
            await self.start()
            yield
            await self.close()

        app.cleanup_ctx.append(lifecycle)
        return app


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _json_object(request: web.Request) -> dict[str, Any] | None:
    """The request's body as a JSON object, or None for anything else (not JSON, a list,
    a number): admin routes answer 400 for those, never 500."""
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return None
    return body if isinstance(body, dict) else None


async def _ok() -> web.Response:
    return web.json_response({"status": "ok"})


async def _write(response: web.StreamResponse, request: web.Request) -> None:
    await response.prepare(request)
    await response.write_eof()


def _closing(response: web.Response) -> web.Response:
    response.force_close()  # what is left of the request is never read
    return response


async def _sse_events(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The `data:` payloads of an SSE stream, one per event; UpstreamError on a line over
    `limit` bytes (an engine that never ends one)."""
    rest = b""
    async for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        if len(rest) > limit:
            raise UpstreamError(f"an SSE line over {limit} bytes (max_response_bytes)")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()
    rest = rest.strip()
    if rest.startswith(b"data:"):
        yield rest[5:].strip()


def _triton_chunk(shaper: tri.Shaper, event: bytes) -> bytes:
    text = tri.text_of(event)
    return shaper.chunk(text) if text else b""


def run_gateway(fleet_path: str, listen: tuple[str, int] | None) -> int:
    """`engineroom gateway`: serve until SIGINT/SIGTERM; SIGHUP reloads fleet.toml."""
    fleet = load_fleet(fleet_path)
    if fleet.gateway is None:
        from console.core.config import ConfigError

        raise ConfigError(f"{fleet.source}: no [gateway] section (url, token_env, ...)")
    settings = fleet.gateway
    admin = fleet.secret(settings.token_env, ("gateway", "token_env"))
    keys = None
    if settings.api_keys_env:
        raw = fleet.secret(settings.api_keys_env, ("gateway", "api_keys_env"))
        keys = [k.strip() for k in raw.split(",") if k.strip()]
    host, port = listen or _listen_of(settings.listen or settings.url)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    _raise_open_files(settings.max_connections)
    logging.getLogger("aiohttp.server").addFilter(_malformed_in_one_line)

    async def serve() -> None:
        gateway = Gateway(fleet, admin_token=admin, api_keys=keys)
        runner = web.AppRunner(
            gateway.app(), access_log=None, handle_signals=False,
            keepalive_timeout=settings.head_timeout_s,  # the next head's deadline, as FrontDoor's
        )  # fmt: skip
        await runner.setup()
        fallback = runner.server
        assert fallback is not None
        gateway.open_connections = lambda: len(gateway.front_doors) + len(fallback.connections)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: FrontDoor(gateway, fallback), host, port, backlog=1024, reuse_address=True
        )
        print(f"engineroom gateway: serving {len(gateway.models)} models on "
              f"http://{host}:{port}", flush=True)  # fmt: skip
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)

        def reload() -> None:
            try:
                changes = gateway.reload(load_fleet(fleet.source))
                print(f"engineroom gateway: reloaded {fleet.source}: {changes}", flush=True)
            except Exception as exc:  # a bad file keeps the running routes
                print(f"engineroom gateway: reload refused: {exc}", flush=True)

        loop.add_signal_handler(signal.SIGHUP, reload)
        await stop.wait()
        server.close()
        await gateway.drain_front_doors(SHUTDOWN_GRACE_S)
        await runner.cleanup()

    asyncio.run(serve())
    return 0


def _malformed_in_one_line(record: logging.LogRecord) -> bool:
    """aiohttp logs a client's malformed request at ERROR, with a traceback and an excerpt
    of the bad line (which may hold a key): it is the client's doing, so one line, no
    excerpt."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, HttpProcessingError):
        record.msg = "a malformed request from a client, answered %d (%s)"
        record.args = (exc.code, exc.__class__.__name__)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


def _raise_open_files(max_connections: int) -> None:
    """Each client connection can hold a socket to the engine too: ask for the hard limit
    of open files when the soft one is short, and say so when even that is."""
    needed = 2 * max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "max_connections %d needs about %d open files; this process may open %d "
            "(ulimit -n): connections will fail before the cap", max_connections, needed, soft,
        )  # fmt: skip


def _listen_of(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80
