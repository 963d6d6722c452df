"""The agent's HTTP API (v1, a contract: docs/architecture.md).

Viewer tokens read; operator tokens also act. A missing or wrong token gets 401, a
viewer token on an operator route 403. Tokens are never logged: the access log is off
and errors name the role, not the token. Only /healthz answers without a token: the
schema (/openapi.json) needs a viewer token, and there is no /docs or /redoc page (its
HTML pulls scripts from a CDN, which a GPU node should not be asked to serve).

A request body is read up to MAX_BODY_BYTES (every body here is a small JSON object);
beyond that the agent answers 413 without reading the rest.

Every answer a route can give, refusals included, is in the schema with its body
(`{"error"}`: console.core.wire.Refusal). A refusal's status says what is wrong: 422 the
request (the schema, or the launch profile), 404 a name this node does not have, 409 the
node's state now (docs/jobs.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import TypeAdapter
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from console import __version__
from console.agent.api.auth import Principal, Role, Tokens
from console.agent.api.exposition import render
from console.agent.jobs.runner import JobRefused, JobRunner
from console.agent.jobs.store import FINAL
from console.agent.snapshot.node import NodeAgent
from console.agent.supervise import processes
from console.core.drills import report as drillreport
from console.core.wire import (
    Health,
    Job,
    JobPlan,
    JobRequest,
    Refusal,
    Snapshot,
    VllmStart,
    WhatIf,
    WhoAmI,
)

_bearer = HTTPBearer(auto_error=False)
MAX_BODY_BYTES = 64 * 1024


class BodyLimit:
    """Reads a request's body up to `limit` bytes, or answers 413 and reads no further."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        # Past 18 digits it is over any limit (and int() refuses 4,300 digits).
        if not declared.isdigit() or len(declared) > 18 or int(declared) > self.limit:
            await self._too_large(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.limit:  # a chunked body declares no length
                await self._too_large(send)
                return
            if not message.get("more_body"):
                break
        replayed = False

        async def again() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # the disconnect, for a streaming response
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, again, send)

    async def _too_large(self, send: Send) -> None:
        payload = json.dumps(
            {"error": f"request body over {self.limit} bytes (or no valid Content-Length)"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class ApiError(HTTPException):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)


def _require(tokens: Tokens, role: Role) -> Callable[..., Awaitable[Principal]]:
    async def check(creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
        if creds is None:
            raise ApiError(401, "missing bearer token", {"WWW-Authenticate": "Bearer"})
        principal = tokens.check(creds.credentials)
        if principal is None:
            raise ApiError(401, "invalid token", {"WWW-Authenticate": "Bearer"})
        if not principal.can(role):
            raise ApiError(
                403, f"this token has the {principal.role} role; this route needs {role}"
            )
        return principal

    return check


# What each refusal means; every route lists those it can give (the fuzzer in
# tests/test_fuzz_api.py holds the agent to the list), each with the Refusal body.
_REFUSALS = {
    400: "the body is not JSON",
    401: "no bearer token, or not one of this agent's (WWW-Authenticate: Bearer)",
    403: "a viewer token on a route that acts",
    404: "no such job, profile, engine or drill on this node",
    409: "the node's state refuses it now: the engine or a GPU is busy with another job, "
    "the preflight failed (its checks come with it), the job already ended",
    413: f"a body over {MAX_BODY_BYTES} bytes, or one without a valid Content-Length",
    422: "a request that breaks the schema, or is outside the launch profile",
    503: "the agent's first snapshot is still being taken",
}
_AUTH_HEADER = {"WWW-Authenticate": {"schema": {"type": "string"}}}


def _refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entries of a route's refusals (401 with its header). Always JSON,
    whatever the route answers when it succeeds (/metrics: text)."""
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Refusal"}}}
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        out[code] = {"description": _REFUSALS[code], "content": body}
        if code == 401:
            out[code]["headers"] = _AUTH_HEADER
    return out


_READ = (401,)  # a viewer route
_ACT = (401, 403)  # an operator route
_BODY = (400, 413, 422)  # a route that reads a JSON body


def _typed_job_bodies(doc: dict[str, Any]) -> dict[str, Any]:
    """The schema with the job requests' models in place of "any object": the routes
    take the body as it is, so that a refusal (a kind that does not exist too) is
    audited with who sent it, and the runner parses it (console.agent.jobs.runner.parse).
    And the Refusal every error answer holds (_refusals)."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    if "JobRequest" in schemas:
        return doc  # app.openapi() caches the document: done once
    adapters: dict[str, TypeAdapter[Any]] = {
        "JobRequest": TypeAdapter(JobRequest),
        "VllmStart": TypeAdapter(VllmStart),
        "Refusal": TypeAdapter(Refusal),
    }
    for name, adapter in adapters.items():
        schema = adapter.json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    for path, name in (("/v1/jobs", "JobRequest"), ("/v1/jobs/plan", "VllmStart")):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        body["schema"] = {"$ref": f"#/components/schemas/{name}"}
    return doc


def _methods(app: FastAPI, path: str) -> list[str]:
    """The methods the path's routes take, for a 405's Allow. Starlette names only the first
    route that matched (GET /v1/jobs, not POST too); a path that is a route of its own
    (/v1/jobs/plan) is not also the `{job_id}` of another."""
    matching = [r for r in app.routes if isinstance(r, APIRoute) and r.path_regex.match(path)]
    exact = [r for r in matching if r.path_format == path]
    return sorted({m for r in exact or matching for m in r.methods or ()})


def create_app(
    agent: NodeAgent, tokens: Tokens, *, run_cycle: bool = True, runner: JobRunner | None = None
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if runner is not None:
            agent.jobs_view = runner.recent
            agent.engines.busy = runner.engine_busy
            agent.trt_view = runner.trt.view
            await runner.start()  # re-adopt engines before the first snapshot lists them
        if run_cycle:
            await agent.cycle()  # serve a real snapshot from the first request on
            agent.start()
        try:
            yield
        finally:
            if runner is not None:
                await runner.close()
            await agent.close()

    app = FastAPI(
        title="engineroom agent",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind a viewer token
    )
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    viewer = _require(tokens, "viewer")
    operator = _require(tokens, "operator")

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(viewer)])
    async def openapi() -> JSONResponse:
        return JSONResponse(_typed_job_bodies(app.openapi()))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {"Allow": ", ".join(_methods(app, request.url.path))}
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse(
            {"error": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422
        )

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        return Health(version=__version__)

    @app.get(
        "/v1/snapshot",
        responses={200: {"model": Snapshot}, **_refusals(*_READ, 503)},
        dependencies=[Depends(viewer)],
    )
    async def snapshot() -> Response:
        if agent.latest is None:
            raise ApiError(503, "the first snapshot is still being taken")
        return Response(agent.latest_json(), media_type="application/json")

    @app.get(
        "/v1/snapshot/stream",
        dependencies=[Depends(viewer)],
        responses={200: {"content": {"application/x-ndjson": {}}}, **_refusals(*_READ)},
    )
    async def snapshot_stream() -> StreamingResponse:
        """Every new snapshot, one JSON document per line, as each cycle ends.

        A console watching a thousand nodes reads a line per node per second instead of
        making a thousand requests a second (bench/console_scale.py measures both).
        """

        async def lines() -> AsyncIterator[bytes]:
            sent: Snapshot | None = None
            while True:
                sent = await agent.next_snapshot(sent)
                yield agent.latest_json() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses=_refusals(*_READ, 503),
        dependencies=[Depends(viewer)],
    )
    async def metrics() -> PlainTextResponse:
        snap = agent.latest
        if snap is None:
            raise ApiError(503, "the first snapshot is still being taken")
        return PlainTextResponse(render(snap), media_type="text/plain; version=0.0.4")

    @app.get("/v1/whoami", response_model=WhoAmI, responses=_refusals(*_READ))
    async def whoami(who: Principal = Depends(viewer)) -> WhoAmI:
        """The caller's role, so a console can disable what its token may not do."""
        return WhoAmI(name=who.name, role=who.role, jobs=runner is not None)

    # Jobs (console.agent.jobs.runner): start, stop and restart engines from launch profiles.
    @app.get(
        "/v1/jobs",
        response_model=list[Job],
        responses=_refusals(*_READ, 422),
        dependencies=[Depends(viewer)],
    )
    async def jobs(limit: int = 100) -> list[Job]:
        return [] if runner is None else runner.jobs(max(1, min(limit, 1000)))

    @app.get(
        "/v1/jobs/{job_id}",
        response_model=Job,
        responses=_refusals(*_READ, 404),
        dependencies=[Depends(viewer)],
    )
    async def job(job_id: str) -> Job:
        found = None if runner is None else runner.job(job_id)
        if found is None:
            raise ApiError(404, f"no job {job_id!r}")
        return found

    @app.get(
        "/v1/jobs/{job_id}/log",
        responses={
            200: {"content": {"text/plain": {}, "text/event-stream": {}}},
            **_refusals(*_READ, 404, 422),
        },
        dependencies=[Depends(viewer)],
    )
    async def job_log(job_id: str, request: Request, tail: int = 200) -> Response:
        """The job's engine log: its last `tail` lines, or followed live with SSE
        (`Accept: text/event-stream`) until the job ends."""
        path = None if runner is None else runner.log_path(job_id)
        if runner is None or path is None:
            raise ApiError(404, f"no job {job_id!r}")
        lines = processes.tail(path, max(1, min(tail, 5000)))
        if "text/event-stream" not in request.headers.get("accept", ""):
            return PlainTextResponse("\n".join(lines) + ("\n" if lines else ""))

        async def events() -> AsyncIterator[bytes]:
            for line in lines:
                yield b"data: " + line.encode() + b"\n\n"
            offset = path.stat().st_size if path.exists() else 0
            while True:
                offset, new = await asyncio.to_thread(processes.new_lines, path, offset)
                for line in new:
                    yield b"data: " + line.encode() + b"\n\n"
                current = runner.job(job_id)
                if current is None or current.state in FINAL:
                    yield b"event: end\ndata: " + (current.state if current else "gone").encode()
                    yield b"\n\n"
                    return
                await asyncio.sleep(0.25)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post(
        "/v1/jobs",
        status_code=202,
        response_model=Job,
        responses=_refusals(*_ACT, *_BODY, 404, 409),
    )
    async def start_job(body: dict[str, Any], who: Principal = Depends(operator)) -> Any:
        if runner is None:
            raise ApiError(422, "this agent runs no jobs (started without a state directory)")
        try:
            return await runner.submit(body, who.name)
        except JobRefused as exc:
            return JSONResponse({"error": str(exc), **exc.extra}, status_code=exc.status)

    @app.get(
        "/v1/jobs/{job_id}/report",
        responses={
            200: {"content": {"application/json": {}, "text/markdown": {}}},
            **_refusals(*_READ, 404, 422),
        },
        dependencies=[Depends(viewer)],
    )
    async def job_report(job_id: str, format: Literal["json", "md"] = "json") -> Response:
        """A drill's report, from its persisted record: JSON, or Markdown (format=md)."""
        found = None if runner is None else runner.job(job_id)
        if found is None:
            raise ApiError(404, f"no job {job_id!r}")
        if found.kind != "drill.run":
            raise ApiError(422, f"job {job_id} is a {found.kind}; only drills have reports")
        report = drillreport.report(found, agent.node)
        if format == "md":
            return PlainTextResponse(drillreport.markdown(report), media_type="text/markdown")
        return JSONResponse(report)

    @app.post(
        "/v1/drills/what-if",
        response_model=list[dict[str, Any]],
        responses=_refusals(*_READ, *_BODY),
        dependencies=[Depends(viewer)],
    )
    async def what_if(body: WhatIf) -> Any:
        """Each TensorRT-LLM deployment here against a hypothetical node: {"driver",
        "cuda", "tensorrt", "tensorrt_llm", "gpu", "compute_capability"}, any of them."""
        if runner is None:
            return []
        try:
            return await runner.trt.what_if(body.model_dump(exclude_none=True))
        except ValueError as exc:
            raise ApiError(422, str(exc)) from None

    @app.post(
        "/v1/jobs/plan",
        responses={200: {"model": JobPlan}, **_refusals(*_READ, *_BODY, 404)},
        dependencies=[Depends(viewer)],
    )
    async def plan_job(body: dict[str, Any]) -> Any:
        """What `POST /v1/jobs` would run, with its preflight, starting nothing."""
        if runner is None:
            raise ApiError(422, "this agent runs no jobs (started without a state directory)")
        try:
            return await runner.plan(body)
        except JobRefused as exc:
            return JSONResponse({"error": str(exc), **exc.extra}, status_code=exc.status)

    @app.delete("/v1/jobs/{job_id}", response_model=Job, responses=_refusals(*_ACT, 404, 409))
    async def cancel_job(job_id: str, who: Principal = Depends(operator)) -> Job:
        if runner is None:
            raise ApiError(404, f"no job {job_id!r}")
        try:
            return await runner.cancel(job_id, who.name)
        except JobRefused as exc:
            raise ApiError(exc.status, str(exc)) from None

    return app
