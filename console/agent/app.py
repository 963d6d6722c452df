"""The agent's HTTP API (v1, a contract: DESIGN.md).

Viewer tokens read; operator tokens also act. A missing or wrong token gets 401, a
viewer token on an operator route 403. Tokens are never logged: the access log is off
and errors name the role, not the token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from console import __version__
from console.agent.auth import Principal, Role, Tokens
from console.agent.exposition import render
from console.agent.node import NodeAgent
from console.core.wire import Health, Job, Snapshot

_bearer = HTTPBearer(auto_error=False)


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


def create_app(agent: NodeAgent, tokens: Tokens, *, run_cycle: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if run_cycle:
            await agent.cycle()  # serve a real snapshot from the first request on
            agent.start()
        try:
            yield
        finally:
            await agent.close()

    app = FastAPI(title="engineroom agent", version=__version__, lifespan=lifespan)
    viewer = _require(tokens, "viewer")
    operator = _require(tokens, "operator")

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": exc.detail},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

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

    @app.get("/v1/snapshot", responses={200: {"model": Snapshot}}, dependencies=[Depends(viewer)])
    async def snapshot() -> Response:
        if agent.latest is None:
            raise ApiError(503, "the first snapshot is still being taken")
        return Response(agent.latest_json(), media_type="application/json")

    @app.get(
        "/v1/snapshot/stream",
        dependencies=[Depends(viewer)],
        responses={200: {"content": {"application/x-ndjson": {}}}},
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

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(viewer)])
    async def metrics() -> PlainTextResponse:
        snap = agent.latest
        if snap is None:
            raise ApiError(503, "the first snapshot is still being taken")
        return PlainTextResponse(render(snap), media_type="text/plain; version=0.0.4")

    # Jobs: the routes are in place; the job kinds (vllm.start, engine.stop, drill.run)
    # arrive with the lifecycle and drill work. Until then nothing can be started.
    @app.get("/v1/jobs", response_model=list[Job], dependencies=[Depends(viewer)])
    async def jobs() -> list[Job]:
        return []

    @app.get("/v1/jobs/{job_id}", response_model=Job, dependencies=[Depends(viewer)])
    async def job(job_id: str) -> Job:
        raise ApiError(404, f"no job {job_id!r}")

    @app.get("/v1/jobs/{job_id}/log", dependencies=[Depends(viewer)])
    async def job_log(job_id: str) -> Response:
        raise ApiError(404, f"no job {job_id!r}")

    @app.post("/v1/jobs", status_code=202, dependencies=[Depends(operator)])
    async def start_job(body: dict[str, Any]) -> dict[str, str]:
        kind = body.get("kind")
        raise ApiError(422, f"job kind {kind!r} is not available on this agent yet")

    @app.delete("/v1/jobs/{job_id}", dependencies=[Depends(operator)])
    async def cancel_job(job_id: str) -> Response:
        raise ApiError(404, f"no job {job_id!r}")

    return app
