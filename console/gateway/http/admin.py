"""The gateway's admin API: routes, weights, failover jobs, the measurement snapshot, the
audit log and Prometheus `/metrics`. Bodies and answers are the models of
console.core.gateway_wire; every refusal is `{"error": "what, where"}` (`refuse`).

Two tokens, both compared in constant time on every call: the admin token
(`[gateway] token_env`) may do everything; the viewer token (`viewer_token_env`, optional)
reads (routes, jobs, plans, the snapshot, the audit, /metrics) and gets a 403 on every
route that acts (`acting=True`: weights, saving them, failovers, cancelling a job).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from console.core.gateway_wire import (
    DeploymentRoute,
    FailoverRequest,
    ModelRoutes,
    RolloutRequest,
    RolloutSteer,
    WeightsUpdate,
    problems,
)
from console.gateway.context import GatewayContext
from console.gateway.failover.job import FailoverRefused
from console.gateway.routing.measure import exposition
from console.gateway.routing.routes import FleetFileChanged, FleetFileUnwritable, save_to_fleet

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Body = TypeVar("Body", bound=BaseModel)


def refuse(status: int, message: str) -> web.Response:
    """Every admin refusal: `{"error": message}` with `status`."""
    return web.json_response({"error": message}, status=status)


class BadBody(Exception):
    """A request body that is not what the route wants; `answer` is the refusal."""

    def __init__(self, answer: web.Response) -> None:
        self.answer = answer


async def _body(request: web.Request, model: type[Body], status: int = 400) -> Body:
    """The request's body as `model`. Not JSON, or not a JSON object: `status` (a list,
    a number or a body nested past the parser's depth never makes a 500); an object that
    does not fit the model: 422, each problem with where it is."""
    fields = ", ".join(model.model_fields)
    try:
        data = await request.json()
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        data = None
    if not isinstance(data, dict):
        raise BadBody(refuse(status, f"the body must be a JSON object ({fields})"))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadBody(refuse(422, f"{problems(exc)} (the body takes {fields})")) from None


class Admin:
    def __init__(self, gateway: GatewayContext) -> None:
        self.gw = gateway

    def add_routes(self, app: web.Application) -> None:
        guard = self.guard
        app.router.add_get("/admin/whoami", guard(self.whoami))
        app.router.add_get("/admin/routes", guard(self.get_routes))
        app.router.add_put("/admin/routes/{model}", guard(self.put_routes, acting=True))
        app.router.add_post("/admin/routes/save", guard(self.save_routes, acting=True))
        app.router.add_post("/admin/failover", guard(self.post_failover, acting=True))
        app.router.add_post("/admin/failover/plan", guard(self.plan_failover))
        app.router.add_get("/admin/jobs", guard(self.list_jobs))
        app.router.add_get("/admin/jobs/{id}", guard(self.get_job))
        app.router.add_delete("/admin/jobs/{id}", guard(self.cancel_job, acting=True))
        app.router.add_post("/admin/rollouts", guard(self.post_rollout, acting=True))
        app.router.add_get("/admin/rollouts", guard(self.list_rollouts))
        app.router.add_get("/admin/rollouts/{id}", guard(self.get_rollout))
        for verb in ("pause", "resume", "abort"):
            app.router.add_post(
                f"/admin/rollouts/{{id}}/{verb}", guard(self.steer_rollout, acting=True)
            )
        app.router.add_get("/admin/snapshot", guard(self.snapshot))
        app.router.add_get("/admin/audit", guard(self.audit))
        app.router.add_get("/metrics", guard(self.metrics))

    def role(self, header: str) -> str | None:
        """The role an Authorization header's token has: "admin", "viewer" or None. Both
        tokens are compared every time, so the timing does not say which one came close."""
        if not header.startswith("Bearer "):
            return None
        given = header[7:].strip().encode()
        admin = hmac.compare_digest(given, self.gw.admin_token)
        viewer = self.gw.viewer_token
        is_viewer = hmac.compare_digest(given, viewer if viewer is not None else b"\0")
        return "admin" if admin else "viewer" if is_viewer and viewer is not None else None

    def guard(self, handler: Handler, acting: bool = False) -> Handler:
        """A known token (an acting route: the admin token), then the handler; a body that
        does not fit its route answered with its refusal."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            header = request.headers.get("Authorization", "")
            role = self.role(header)
            if role is None:
                missing = not header.startswith("Bearer ")
                return refuse(401, "missing bearer token" if missing else "invalid token")
            if acting and role != "admin":
                return refuse(
                    403,
                    f"this is the gateway's viewer token: {request.method} "
                    f"{request.path} acts and needs the admin token",
                )
            request["role"] = role
            try:
                return await handler(request)
            except BadBody as bad:
                return bad.answer
            except FailoverRefused as exc:
                return refuse(exc.status, str(exc))

        return guarded

    async def whoami(self, request: web.Request) -> web.Response:
        """The caller's role, so a console can say up front what its token may not do."""
        return web.json_response({"role": request["role"]})

    # -- routes --------------------------------------------------------------------------

    def routes_view(self) -> dict[str, ModelRoutes]:
        table = self.gw.table
        return {
            name: ModelRoutes(
                auto_failover=table.models[name].auto_failover,
                failover_job=self.gw.failovers.running.get(name),
                deployments=[
                    DeploymentRoute(
                        id=u.id,
                        engine=u.kind,
                        node=u.dep.node,
                        endpoint=u.dep.endpoint,
                        weight=table.weights[name].get(u.id, 0),
                        up=u.up,
                        reason=u.reason,
                        inflight=u.inflight,
                    )
                    for u in ups
                ],
            )
            for name, ups in table.upstreams.items()
        }

    async def get_routes(self, request: web.Request) -> web.Response:
        view = {name: routes.model_dump() for name, routes in self.routes_view().items()}
        return web.json_response(view)

    async def put_routes(self, request: web.Request) -> web.Response:
        table = self.gw.table
        model = request.match_info["model"]
        if model not in table.models:
            return refuse(404, f"no model {model!r} (models: {', '.join(table.models)})")
        update = await _body(request, WeightsUpdate, status=422)
        known = [u.id for u in table.upstreams[model]]
        for dep in update.weights:
            if dep not in known:
                return refuse(
                    422, f"weights: no deployment {dep!r} of {model} ({', '.join(known)})"
                )
        if (job := self.gw.failovers.running.get(model)) is not None:
            return refuse(409, f"a failover of {model} is running (job {job}); cancel it first")
        table.set_weights(model, update.weights, "admin", update.why or "set by the admin API")
        return web.json_response(self.routes_view()[model].model_dump())

    async def save_routes(self, request: web.Request) -> web.Response:
        table = self.gw.table
        try:
            changed = await asyncio.to_thread(save_to_fleet, table.fleet, table.weights)
        except FleetFileChanged as exc:  # a hand edit since the load: never overwritten
            return refuse(409, str(exc))
        except FleetFileUnwritable as exc:  # its folder is not ours to write: says so
            return refuse(500, str(exc))
        table.store.audit("admin", "routes saved to fleet.toml", {"changed": changed})
        return web.json_response({"path": str(table.fleet.source), "changed": changed})

    # -- failovers -----------------------------------------------------------------------

    async def post_failover(self, request: web.Request) -> web.Response:
        ask = await _body(request, FailoverRequest)
        job = await self.gw.failovers.start(
            ask.model, ask.mode, "admin", ask.why,
            to=ask.to, drain=ask.drain, restore_before=ask.restore_before,
        )  # fmt: skip
        return web.json_response(job, status=202)

    async def plan_failover(self, request: web.Request) -> web.Response:
        ask = await _body(request, FailoverRequest)  # mode and why are not used here
        plan = await self.gw.failovers.plan(
            ask.model, to=ask.to, drain=ask.drain, restore_before=ask.restore_before
        )
        return web.json_response(plan)

    async def get_job(self, request: web.Request) -> web.Response:
        job = self.gw.failovers.job(request.match_info["id"])
        if job is None:
            return refuse(404, f"no job {request.match_info['id']!r}")
        return web.json_response(job)

    async def list_jobs(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.failovers.jobs())

    async def cancel_job(self, request: web.Request) -> web.Response:
        return web.json_response(await self.gw.failovers.cancel(request.match_info["id"]))

    # -- rollouts (docs/rollouts.md) ------------------------------------------------------

    async def post_rollout(self, request: web.Request) -> web.Response:
        ask = await _body(request, RolloutRequest)
        return web.json_response(self.gw.rollouts.start(ask.plan, ask.who, ask.why), status=202)

    async def list_rollouts(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.rollouts.records())

    async def get_rollout(self, request: web.Request) -> web.Response:
        record = self.gw.rollouts.get(request.match_info["id"])
        if record is None:
            return refuse(404, f"no rollout {request.match_info['id']!r}")
        return web.json_response(record)

    async def steer_rollout(self, request: web.Request) -> web.Response:
        ask = await _body(request, RolloutSteer)
        rollouts, rollout_id = self.gw.rollouts, request.match_info["id"]
        verb = request.path.rsplit("/", 1)[1]
        if verb == "abort":
            return web.json_response(await rollouts.abort(rollout_id, ask.who, ask.why))
        steer = rollouts.pause if verb == "pause" else rollouts.resume
        return web.json_response(steer(rollout_id, ask.who, ask.why))

    # -- measures ------------------------------------------------------------------------

    async def snapshot(self, request: web.Request) -> web.Response:
        table = self.gw.table
        out: dict[str, Any] = {"time": time.time(), "models": {}}
        for name, ups in table.upstreams.items():
            out["models"][name] = {
                u.id: {
                    "weight": table.weights[name].get(u.id, 0),
                    "up": u.up,
                    "reason": u.reason,
                    "inflight": u.inflight,
                    **u.measures.summary(),
                }
                for u in ups
            }
        return web.json_response(out)

    async def audit(self, request: web.Request) -> web.Response:
        return web.json_response(self.gw.table.store.audit_log(200))

    async def metrics(self, request: web.Request) -> web.Response:
        gw, table = self.gw, self.gw.table
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            # Each family's samples follow its own HELP and TYPE, as the format wants.
            lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples))

        family(
            "engineroom_gateway_connections",
            "gauge",
            "client connections open now",
            [f"engineroom_gateway_connections {gw.open_connections()}"],
        )
        family(
            "engineroom_gateway_connections_refused_total",
            "counter",
            "client connections refused at max_connections",
            [f"engineroom_gateway_connections_refused_total {gw.connections_refused}"],
        )
        family(
            "engineroom_gateway_client_gone_total",
            "counter",
            "clients that hung up before their answer ended",
            [f"engineroom_gateway_client_gone_total {gw.relay.clients_gone}"],
        )
        family(
            "engineroom_gateway_client_stalled_total",
            "counter",
            "clients cut off because they took no byte within write_timeout_s",
            [f"engineroom_gateway_client_stalled_total {gw.relay.clients_stalled}"],
        )
        upstreams = [
            (f'model="{name}",deployment="{u.id}",engine="{u.kind}"', name, u)
            for name, ups in table.upstreams.items()
            for u in ups
        ]
        per_upstream = (
            ("inflight", "gauge", "requests in flight to the deployment", lambda n, u: u.inflight),
            (
                "weight",
                "gauge",
                "the deployment's routing weight for the model",
                lambda n, u: table.weights[n].get(u.id, 0),
            ),
            (
                "up",
                "gauge",
                "1 when the deployment passes its health checks",
                lambda n, u: int(u.up),
            ),
            (
                "health_checks_total",
                "counter",
                "health checks run against the deployment",
                lambda n, u: u.checks,
            ),
            (
                "requests_total",
                "counter",
                "requests the deployment finished, ok or failed",
                lambda n, u: u.measures.outcomes.ok_total + u.measures.outcomes.failed_total,
            ),
            (
                "failures_total",
                "counter",
                "requests the deployment failed",
                lambda n, u: u.measures.outcomes.failed_total,
            ),
        )
        for suffix, kind, help_text, value in per_upstream:
            name = f"engineroom_gateway_{suffix}"
            family(
                name, kind, help_text, [f"{name}{{{lb}}} {value(n, u)}" for lb, n, u in upstreams]
            )
        for series, help_text in (
            ("ttft", "time to first token through the gateway"),
            ("itl", "inter-token latency through the gateway"),
            ("e2e", "request latency through the gateway, first byte in to last byte out"),
        ):
            name = f"engineroom_gateway_{series}_seconds"
            samples = [
                line
                for lb, _, u in upstreams
                for line in exposition(name, lb, getattr(u.measures, series))
            ]
            family(name, "histogram", help_text, samples)
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
