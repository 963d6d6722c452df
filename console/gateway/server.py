"""The gateway: one OpenAI-compatible front door for every engine of the fleet.

    engineroom gateway --fleet fleet.toml [--listen HOST:PORT]

Front door: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`. A
request is routed by its model name across that model's deployments, by the live
weights; streams are passed through chunk by chunk as they arrive. Triton deployments
get OpenAI <-> generate/generate_stream translation (console.gateway.triton_openai).

Data path: aiohttp server and aiohttp client with kept-alive upstream connections, the
body forwarded as the bytes that came in (parsed once, for the model and `stream`), each
upstream chunk written out as soon as it is read. bench/gateway_overhead.py measures it
against a direct connection and nginx. A hand-written HTTP/1.1 upstream client (bytes in,
bytes out, no request objects) was tried in its place and measured no better (+0.50 ms
at p50 against +0.45-0.55 ms), so the simpler aiohttp client stayed; the remaining cost
is per-request Python on both sides of the proxy.

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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from console.core.config import Fleet, Model, load_fleet
from console.gateway import triton_openai as tri
from console.gateway.failover import FailoverRefused, Failovers
from console.gateway.measure import exposition
from console.gateway.routes import GatewayStore, save_to_fleet
from console.gateway.upstream import Upstream, build_upstreams, health_loop

log = logging.getLogger(__name__)

JSON = {"Content-Type": "application/json"}
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SERVED_BY = "X-Engineroom-Deployment"  # which deployment answered: for clients and benches


class NotStarted(Exception):
    """The upstream failed before the client got a byte: safe to try another deployment."""


def openai_error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status)


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
        if self.http is not None:
            await self.http.close()
        self.store.close()

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

    def _client_ok(self, request: web.Request) -> bool:
        if not self.api_keys:
            return True
        header = request.headers.get("Authorization", "")
        key = header.removeprefix("Bearer ").strip().encode()
        found = False
        for allowed in self.api_keys:  # every key compared: no early exit on a match
            found |= hmac.compare_digest(key, allowed)
        return found

    async def models_list(self, request: web.Request) -> web.Response:
        if not self._client_ok(request):
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
        if not self._client_ok(request):
            return openai_error(401, "invalid API key", "invalid_request_error", "invalid_api_key")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return openai_error(
                413,
                f"request body over {self.settings.max_body_bytes} bytes",
                "invalid_request_error",
            )
        try:
            data = json.loads(body)
        except ValueError as exc:
            return openai_error(400, f"the body is not JSON: {exc}", "invalid_request_error")
        if not isinstance(data, dict):
            return openai_error(400, "the body must be a JSON object", "invalid_request_error")
        model = data.get("model")
        if not isinstance(model, str) or model not in self.models:
            return openai_error(
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
                return await self._forward(request, upstream, data, body, chat, stream)
            except NotStarted as exc:
                why = f"{upstream.id}: {exc}"
            except tri.BadRequest as exc:
                return openai_error(400, str(exc), "invalid_request_error")
        return openai_error(503, f"no deployment of {model} could answer ({why})", "server_error")

    async def _forward(
        self,
        request: web.Request,
        up: Upstream,
        data: dict[str, Any],
        body: bytes,
        chat: bool,
        stream: bool,
    ) -> web.StreamResponse:
        up.inflight += 1
        try:
            if up.kind == "triton":
                return await self._triton(request, up, data, chat, stream)
            if data.get("model") != up.engine_model:
                body = json.dumps({**data, "model": up.engine_model}).encode()
            path = "/v1/chat/completions" if chat else "/v1/completions"
            return await self._pass_through(request, up, up.dep.endpoint + path, body, stream)
        finally:
            up.inflight -= 1

    async def _open(self, up: Upstream, url: str, body: bytes) -> aiohttp.ClientResponse:
        """POST upstream; any failure here is before the client saw a byte."""
        assert self.http is not None
        try:
            resp = await self.http.post(url, data=body, headers=JSON)
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            up.measures.outcomes.add(False)
            if up.mark_down(f"connection failed: {exc.__class__.__name__}"):
                self.failovers.maybe_auto(up)
            raise NotStarted("connection failed") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            up.measures.outcomes.add(False)
            raise NotStarted(f"{exc.__class__.__name__}") from None
        if resp.status >= 500:
            text = (await resp.read())[:200].decode(errors="replace")
            resp.release()
            up.measures.outcomes.add(False)
            if up.server_error(resp.status):
                self.failovers.maybe_auto(up)
            raise NotStarted(f"HTTP {resp.status}: {text}")
        return resp

    async def _pass_through(
        self, request: web.Request, up: Upstream, url: str, body: bytes, stream: bool
    ) -> web.StreamResponse:
        started = time.perf_counter()
        resp = await self._open(up, url, body)
        try:
            if not stream or resp.status != 200:
                payload = await resp.read()
                up.measures.e2e.add(time.perf_counter() - started)
                up.measures.outcomes.add(True)
                return web.Response(
                    body=payload,
                    status=resp.status,
                    content_type=resp.content_type or "application/json",
                    headers={SERVED_BY: up.id},
                )
            out = web.StreamResponse(status=200, headers={**SSE_HEADERS, SERVED_BY: up.id})
            await out.prepare(request)
            await self._relay(request, out, up, resp.content.iter_any(), started, None)
            return out
        finally:
            resp.release()

    async def _relay(
        self,
        request: web.Request,
        out: web.StreamResponse,
        up: Upstream,
        chunks: Any,
        started: float,
        shaper: tri.Shaper | None,
    ) -> bool | None:
        """Copy upstream chunks to the client as they come; measure TTFT and gaps.

        Returns True when the upstream finished, False when it was cut (the client got an
        error event), None when the client went away (not the deployment's failure)."""
        last = started
        first = True
        try:
            async for chunk in chunks:
                if shaper is not None:
                    chunk = await _triton_chunk(shaper, chunk)
                    if not chunk:
                        continue
                now = time.perf_counter()
                if first:
                    up.measures.ttft.add(now - started)
                    first = False
                else:
                    up.measures.itl.add(now - last)
                last = now
                try:
                    await out.write(chunk)
                except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                    return None  # the client left; closing upstream aborts its request
            if shaper is not None:
                with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                    await out.write(shaper.last())
        except (aiohttp.ClientError, TimeoutError, tri.BadRequest) as exc:
            up.measures.outcomes.add(False)
            event = {
                "error": {
                    "message": f"the engine ({up.id}) stopped mid-answer: {exc.__class__.__name__}",
                    "type": "server_error",
                }
            }
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                await out.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            return False
        up.measures.e2e.add(time.perf_counter() - started)
        up.measures.outcomes.add(True)
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await out.write_eof()
        return True

    async def _triton(
        self, request: web.Request, up: Upstream, data: dict[str, Any], chat: bool, stream: bool
    ) -> web.StreamResponse:
        path, tbody = tri.request(data, chat, up.dep, up.engine_model)
        shaper = tri.Shaper(chat, up.model, tbody["max_tokens"])
        started = time.perf_counter()
        resp = await self._open(up, up.dep.endpoint + path, json.dumps(tbody).encode())
        try:
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")
                up.measures.outcomes.add(True)  # a client error, not the deployment's
                message = text
                with contextlib.suppress(ValueError):
                    message = str(json.loads(text).get("error", text))
                return openai_error(resp.status, message[:500], "invalid_request_error")
            if not stream:
                answer = await resp.read()
                text = tri.text_of(answer)
                up.measures.e2e.add(time.perf_counter() - started)
                up.measures.outcomes.add(True)
                return web.json_response(shaper.response(text), headers={SERVED_BY: up.id})
            out = web.StreamResponse(status=200, headers={**SSE_HEADERS, SERVED_BY: up.id})
            await out.prepare(request)
            await self._relay(request, out, up, _sse_events(resp), started, shaper)
            return out
        finally:
            resp.release()

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


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _ok() -> web.Response:
    return web.json_response({"status": "ok"})


async def _sse_events(resp: aiohttp.ClientResponse) -> Any:
    """The `data:` payloads of an SSE stream, one per event."""
    async for line in resp.content:
        line = line.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


async def _triton_chunk(shaper: tri.Shaper, event: bytes) -> bytes:
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
        site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
        await site.start()
        print(f"engineroom gateway: serving {len(gateway.models)} models on "
              f"http://{host}:{port}", flush=True)  # fmt: skip
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
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
        await runner.cleanup()

    asyncio.run(serve())
    return 0


def _listen_of(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80
