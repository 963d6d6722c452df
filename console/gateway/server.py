"""The gateway: one OpenAI-compatible front door for every engine of the fleet.

    engineroom gateway --fleet fleet.toml [--listen HOST:PORT]

Front door: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`. A
request is routed by its model name across that model's deployments, by the live
weights; streams are passed through chunk by chunk as they arrive. Triton deployments
get OpenAI <-> generate/generate_stream translation (console.gateway.triton_openai).

Data path: FrontDoor (an asyncio protocol, below) serves the two completion routes itself
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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp import web

from console.core.config import Fleet, Model, load_fleet
from console.gateway import triton_openai as tri
from console.gateway.failover import FailoverRefused, Failovers
from console.gateway.measure import exposition
from console.gateway.routes import GatewayStore, save_to_fleet
from console.gateway.upstream import (
    Answer,
    Upstream,
    UpstreamError,
    build_upstreams,
    health_loop,
)

log = logging.getLogger(__name__)

JSON = {"Content-Type": "application/json"}
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SERVED_BY = "X-Engineroom-Deployment"  # which deployment answered: for clients and benches


class NotStarted(Exception):
    """The upstream failed before the client got a byte: safe to try another deployment."""


class ClientGone(Exception):
    """The client closed its connection: not the deployment's failure."""


def _error_body(message: str, kind: str, code: str | None) -> bytes:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return json.dumps(body).encode()


def openai_error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    body = _error_body(message, kind, code)
    return web.Response(body=body, status=status, content_type="application/json")


async def _error(sink: Sink, status: int, message: str, kind: str, code: str | None = None) -> None:
    await sink.reply(status, _error_body(message, kind, code), "application/json", None)


class Sink:
    """Where one answer goes: an aiohttp response, or FrontDoor's connection."""

    async def reply(
        self, status: int, body: bytes, content_type: str, served_by: str | None
    ) -> None:
        """A whole answer."""
        raise NotImplementedError

    async def open_stream(self, served_by: str) -> None:
        """A 200 SSE answer begins (its head may wait for the first chunk)."""
        raise NotImplementedError

    async def write(self, chunk: bytes) -> None:
        """One chunk of the stream, sent now; ClientGone when the client left."""
        raise NotImplementedError

    async def close_stream(self) -> None:
        raise NotImplementedError


class _SseResponse(web.StreamResponse):
    _send_headers_immediately = False  # the head goes out with the first chunk


class AiohttpSink(Sink):
    def __init__(self, request: web.Request) -> None:
        self.request = request
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
            await self.response.write(chunk)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            raise ClientGone from None

    async def close_stream(self) -> None:
        try:
            await self.response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            raise ClientGone from None


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
        """The front door as an aiohttp handler (connections FrontDoor handed over)."""
        sink = AiohttpSink(request)
        if not self.client_ok(request.headers.get("Authorization")):
            await _error(sink, 401, "invalid API key", "invalid_request_error", "invalid_api_key")
            return sink.response
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            message = f"request body over {self.settings.max_body_bytes} bytes"
            await _error(sink, 413, message, "invalid_request_error")
            return sink.response
        await self.answer(body, chat, sink)
        return sink.response

    async def answer(self, body: bytes, chat: bool, sink: Sink) -> None:
        """One completion (chat or not) from an authorized client, answered into `sink`."""
        try:
            data = json.loads(body)
        except ValueError as exc:
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
            try:
                return await self._forward(sink, upstream, data, body, chat, stream)
            except NotStarted as exc:
                why = f"{upstream.id}: {exc}"
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
            payload = await ans.read()
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
        error event), None when the client went away (not the deployment's failure)."""
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
        except ClientGone:
            return None  # closing the upstream connection aborts its request
        except (UpstreamError, TimeoutError, tri.BadRequest) as exc:
            up.measures.outcomes.add(False)
            event = {
                "error": {
                    "message": f"the engine ({up.id}) stopped mid-answer: {exc.__class__.__name__}",
                    "type": "server_error",
                }
            }
            with contextlib.suppress(ClientGone):
                await sink.write(b"data: " + json.dumps(event).encode() + b"\n\n")
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
            await self._relay(sink, up, _sse_events(ans.chunks()), started, shaper)
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
        except (ValueError, KeyError, TypeError):
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
        changed = await asyncio.to_thread(save_to_fleet, self.fleet, self.weights)
        self.store.audit("admin", "routes saved to fleet.toml", {"changed": changed})
        return web.json_response({"path": str(self.fleet.source), "changed": changed})

    async def post_failover(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "the body is not JSON"}, status=400)
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
        try:
            body = await request.json()
            result = await self.failovers.plan(str(body.get("model")), str(body.get("to")))
        except ValueError:
            return _refuse(400, "the body is not JSON")
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
                    f"engineroom_gateway_requests_total{{{labels}}} "
                    f"{m.outcomes.ok_total + m.outcomes.failed_total}",
                    f"engineroom_gateway_failures_total{{{labels}}} {m.outcomes.failed_total}",
                    *exposition("engineroom_gateway_ttft_seconds", labels, m.ttft),
                    *exposition("engineroom_gateway_itl_seconds", labels, m.itl),
                    *exposition("engineroom_gateway_e2e_seconds", labels, m.e2e),
                ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
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


# -- the data path's server ----------------------------------------------------------------

FAST = {b"/v1/completions": False, b"/v1/chat/completions": True}  # path: chat
MAX_HEAD = 16384
IDLE_S = 75.0  # a kept-alive client connection with no request, as aiohttp's default
SHUTDOWN_GRACE_S = 10.0


class FrontDoor(asyncio.Protocol):
    """The data path's HTTP/1.1 server, one per client connection.

    It serves `POST /v1/completions` and `/v1/chat/completions` with a Content-Length body
    itself: the head split in Python, the answer written straight to the socket, the SSE
    head in the same packet as the first chunk. Anything else (the admin API,
    `/v1/models`, a chunked or oversized upload, `Expect`, HTTP/1.0, a malformed head) is
    handed, connection and unread bytes, to aiohttp, which serves the rest of the gateway.
    aiohttp's server costs ~0.3 ms of Python per request, over the whole budget
    (docs/gateway.md, Figures)."""

    def __init__(self, gateway: Gateway, fallback: Callable[[], asyncio.Protocol]) -> None:
        self.gw = gateway
        self.fallback = fallback
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.writable: asyncio.Future[None] | None = None  # set while the socket is full
        self.idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.gw.front_doors.add(self)
        self._wait_idle()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.task is None:
            self._next()
        elif len(self.buf) > MAX_HEAD and self.transport is not None:
            self.transport.pause_reading()  # a client sending ahead while it is answered

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.gw.front_doors.discard(self)
        if self.idle is not None:
            self.idle.cancel()
        # An answer in flight is not cancelled (nor is it by aiohttp): its next write finds
        # the client gone and closes the upstream connection, which stops the engine; an
        # answer the client read to its end is counted as served.
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None

    def _wait_idle(self) -> None:
        if self.transport is not None:
            self.idle = asyncio.get_running_loop().call_later(IDLE_S, self.transport.close)

    def _next(self) -> None:
        """Start on the next request in the buffer, once its head and body are in."""
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._hand_over()
            return
        lines = bytes(buf[:end]).split(b"\r\n")
        method, _, rest = lines[0].partition(b" ")
        target, _, version = rest.partition(b" ")
        chat = FAST.get(target)
        if method != b"POST" or chat is None or version != b"HTTP/1.1":
            return self._hand_over()
        length, auth, close = -1, None, False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or name[-1:] in (b" ", b"\t") or line[:1] in (b" ", b"\t"):
                return self._hand_over()  # aiohttp answers malformed heads
            name, value = name.lower(), value.strip()
            if name == b"content-length":
                if length >= 0 or not value.isdigit():
                    return self._hand_over()
                length = int(value)
            elif name in (b"transfer-encoding", b"expect", b"upgrade"):
                return self._hand_over()
            elif name == b"authorization":
                auth = value.decode("latin-1")
            elif name == b"connection":
                close = b"close" in value.lower()
        if not 0 <= length <= self.gw.settings.max_body_bytes:
            return self._hand_over()
        total = end + 4 + length
        if len(buf) < total:
            return
        body = bytes(buf[end + 4 : total])
        del buf[:total]
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self.task = asyncio.get_running_loop().create_task(self._serve(auth, body, chat, close))

    def _hand_over(self) -> None:
        transport = self.transport
        if transport is None:
            return
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self.gw.front_doors.discard(self)
        protocol = self.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        transport.resume_reading()
        data, self.buf = bytes(self.buf), bytearray()
        protocol.data_received(data)

    async def _serve(self, auth: str | None, body: bytes, chat: bool, close: bool) -> None:
        sink = RawSink(self, close)
        try:
            if self.gw.client_ok(auth):
                await self.gw.answer(body, chat, sink)
            else:
                await _error(
                    sink, 401, "invalid API key", "invalid_request_error", "invalid_api_key"
                )
        except Exception:
            log.exception("the gateway failed on a request")
            if not sink.started:
                with contextlib.suppress(ClientGone):
                    await _error(sink, 500, "the gateway failed; see its log", "server_error")
            close = True
        finally:
            self.task = None
        transport = self.transport
        if transport is None:
            return
        if close or sink.close:
            transport.close()
            return
        self._wait_idle()
        transport.resume_reading()
        if self.buf:
            self._next()

    async def drain(self) -> None:
        if self.writable is not None:
            await self.writable
        if self.transport is None or self.transport.is_closing():
            raise ClientGone


class RawSink(Sink):
    """An answer written straight to a FrontDoor connection."""

    def __init__(self, door: FrontDoor, close: bool) -> None:
        self.door = door
        self.close = close
        self.started = False
        self.head = b""  # a stream's head, sent with its first chunk

    def _head(self, status: int, fields: str) -> bytes:
        self.started = True
        phrase = _PHRASES.get(status, "")
        close = "Connection: close\r\n" if self.close else ""
        return f"HTTP/1.1 {status} {phrase}\r\nDate: {_date()}\r\n{fields}{close}\r\n".encode()

    def _send(self, data: bytes) -> None:
        transport = self.door.transport
        if transport is None or transport.is_closing():
            raise ClientGone
        transport.write(data)

    async def reply(
        self, status: int, body: bytes, content_type: str, served_by: str | None
    ) -> None:
        fields = f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        if served_by is not None:
            fields += f"{SERVED_BY}: {served_by}\r\n"
        self._send(self._head(status, fields) + body)
        await self.door.drain()

    async def open_stream(self, served_by: str) -> None:
        self.head = self._head(200, f"{_SSE_FIELDS}{SERVED_BY}: {served_by}\r\n")

    async def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._send(b"%s%x\r\n%s\r\n" % (self.head, len(chunk), chunk))
        self.head = b""
        if self.door.writable is not None:
            await self.door.drain()

    async def close_stream(self) -> None:
        self._send(self.head + b"0\r\n\r\n")
        self.head = b""


_PHRASES = {s.value: s.phrase for s in HTTPStatus}
_SSE_FIELDS = "".join(f"{k}: {v}\r\n" for k, v in SSE_HEADERS.items())
_SSE_FIELDS += "Transfer-Encoding: chunked\r\n"
_dates: tuple[int, str] = (0, "")


def _date() -> str:
    """The Date header, formatted once a second."""
    global _dates
    now = int(time.time())
    if _dates[0] != now:
        _dates = (now, formatdate(now, usegmt=True))
    return _dates[1]


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _ok() -> web.Response:
    return web.json_response({"status": "ok"})


async def _sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The `data:` payloads of an SSE stream, one per event."""
    rest = b""
    async for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
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

    async def serve() -> None:
        gateway = Gateway(fleet, admin_token=admin, api_keys=keys)
        runner = web.AppRunner(gateway.app(), access_log=None, handle_signals=False)
        await runner.setup()
        fallback = runner.server
        assert fallback is not None
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


def _listen_of(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80
