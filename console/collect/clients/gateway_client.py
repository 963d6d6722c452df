"""The gateway's admin API from the console and the CLI (no Textual here): routes, the
measurement snapshot, failover jobs. One client for both: the console awaits it, the
`engineroom failover` command runs it in its own event loop.

The admin token comes from [gateway].token_env and must be set: a missing token is a
ConfigError naming the variable, never a request with an empty bearer token. Nothing else
comes from the environment (no proxy: console/collect/clients/apiclient.py), and every call has a
total deadline and a cap on the answer's size. Answers are checked against
console.core.gateway_wire, so a gateway (or a proxy in front of it) that answers something
else is a GatewayError that says what came, not a KeyError later.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from console.collect.clients import apiclient
from console.core.config.load import ConfigError, Fleet, MissingSecret
from console.core.gateway_wire import (
    FailoverJob,
    FailoverRequest,
    Plan,
    RolloutRecord,
    RolloutRequest,
    RolloutSteer,
    problems,
)

A = TypeVar("A", bound=BaseModel)


class GatewayError(Exception):
    """The gateway refused or did not answer; str() says why, with the gateway's URL.

    `status` is the HTTP status of the answer (None: no answer came), `reason` the why
    alone (the gateway's own error, `HTTP 502: ...`, `no answer within 5 s`)."""

    def __init__(self, url: str, status: int | None, reason: str) -> None:
        where = f"gateway {url} did not answer" if status is None else f"gateway {url}"
        super().__init__(f"{where} ({reason})" if status is None else reason)
        self.url = url
        self.status = status
        self.reason = reason


class GatewayClient:
    def __init__(self, fleet: Fleet, timeout: float = 5.0) -> None:
        """ConfigError when the fleet file has no [gateway] or its token is not set."""
        if fleet.gateway is None:
            raise ConfigError(f"{fleet.source}: no [gateway] section (url, token_env, ...)")
        token = fleet.secret(fleet.gateway.token_env, ("gateway", "token_env"))
        self.url = fleet.gateway.url.rstrip("/")
        self.timeout = timeout  # per call, the whole answer included
        self._client = apiclient.async_client(
            self.url, {"Authorization": f"Bearer {token}"}, timeout
        )

    @staticmethod
    def configured(fleet: Fleet) -> bool:
        """A gateway is declared and its token set (by the rule the client itself keeps)."""
        if fleet.gateway is None:
            return False
        try:
            fleet.secret(fleet.gateway.token_env, ("gateway", "token_env"))
        except MissingSecret:
            return False
        return True

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(
        self, method: str, path: str, body: BaseModel | dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """(status, the answer as a JSON object); GatewayError for anything else."""
        if isinstance(body, BaseModel):
            body = body.model_dump()
        try:
            status, raw = await apiclient.request(
                self._client,
                method,
                path,
                json=body,
                deadline_s=self.timeout,
            )
        except apiclient.NoAnswer as exc:
            raise GatewayError(self.url, None, str(exc)) from None
        data = apiclient.json_object(raw)
        if status >= 400 or data is None:
            raise GatewayError(self.url, status, _error_of(status, raw))
        return status, data

    def _as(self, model: type[A], status: int, data: dict[str, Any]) -> A:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            what = f"HTTP {status} that is not a {model.__name__} ({problems(exc)})"
            raise GatewayError(self.url, status, what) from None

    async def snapshot(self) -> dict[str, Any]:
        return (await self._call("GET", "/admin/snapshot"))[1]

    async def whoami(self) -> str | None:
        """What our token may do on the gateway: "admin" or "viewer" (None: it did not
        say), so a console disables what a viewer token may not do before it is tried."""
        role = (await self._call("GET", "/admin/whoami"))[1].get("role")
        return role if role in ("admin", "viewer") else None

    def _ask(self, **fields: str | None) -> FailoverRequest:
        """A failover body (the fields given, none left null); one the gateway would refuse
        is refused here, as it would."""
        try:
            return FailoverRequest.model_validate(
                {k: v for k, v in fields.items() if v is not None}
            )
        except ValidationError as exc:
            raise GatewayError(self.url, 422, problems(exc)) from None

    async def failover(
        self,
        model: str,
        to: str | None,
        mode: str,
        why: str,
        *,
        drain: str | None = None,
        restore_before: str | None = None,
    ) -> FailoverJob:
        """The job the gateway started: all of `model` to `to`
        (a fail-back when it undoes the last move), `drain` a deployment (onto `to` when
        given), or the weights from before job `restore_before`."""
        ask = self._ask(
            model=model, to=to, drain=drain, restore_before=restore_before, mode=mode, why=why
        )
        body = ask.model_dump(exclude_none=True)
        status, data = await self._call("POST", "/admin/failover", body)
        return self._as(FailoverJob, status, data)

    async def plan(
        self,
        model: str,
        to: str | None,
        *,
        drain: str | None = None,
        restore_before: str | None = None,
    ) -> Plan:
        """The move and its preflight (ok, detail, the weights before and
        after, the deployments that gain and lose traffic)."""
        ask = self._ask(model=model, to=to, drain=drain, restore_before=restore_before)
        body = ask.model_dump(exclude_none=True, include={"model", "to", "drain",
                                                          "restore_before"})  # fmt: skip
        status, data = await self._call("POST", "/admin/failover/plan", body)
        return self._as(Plan, status, data)

    async def job(self, job_id: str) -> FailoverJob:
        return self._as(FailoverJob, *await self._call("GET", f"/admin/jobs/{job_id}"))

    async def audit(self) -> list[dict[str, Any]]:
        """The gateway's audit log, newest first (its last 200 rows): who changed which
        route and why. A recorder reads it (console/collect/recordings/recorder.py)."""
        try:
            status, raw = await apiclient.request(
                self._client, "GET", "/admin/audit", deadline_s=self.timeout
            )
        except apiclient.NoAnswer as exc:
            raise GatewayError(self.url, None, str(exc)) from None
        try:
            rows = json.loads(raw)
        except ValueError:
            rows = None
        if status >= 400 or not isinstance(rows, list):
            raise GatewayError(self.url, status, _error_of(status, raw))
        return [r for r in rows if isinstance(r, dict)]

    async def jobs(self) -> list[FailoverJob]:
        """The gateway's failover jobs, newest first (its last 50), running and ended.
        The console's Jobs screen lists them."""
        return [self._as(FailoverJob, 200, row) for row in await self._list("/admin/jobs")]

    # -- rollouts (docs/rollouts.md) ------------------------------------------------------

    async def rollout_start(self, plan: dict[str, Any], who: str, why: str) -> RolloutRecord:
        """Run `plan` (a plan document) in the gateway: the rollout it started."""
        body = RolloutRequest(plan=plan, who=who, why=why)
        return self._as(RolloutRecord, *await self._call("POST", "/admin/rollouts", body))

    async def rollouts(self) -> list[RolloutRecord]:
        """The gateway's rollouts, newest first, open and ended."""
        return [self._as(RolloutRecord, 200, r) for r in await self._list("/admin/rollouts")]

    async def rollout(self, rollout_id: str) -> RolloutRecord:
        return self._as(RolloutRecord, *await self._call("GET", f"/admin/rollouts/{rollout_id}"))

    async def rollout_steer(self, rollout_id: str, verb: str, who: str, why: str) -> RolloutRecord:
        """`verb`: pause, resume or abort."""
        body = RolloutSteer(who=who, why=why)
        path = f"/admin/rollouts/{rollout_id}/{verb}"
        return self._as(RolloutRecord, *await self._call("POST", path, body))

    async def _list(self, path: str) -> list[dict[str, Any]]:
        """A JSON list of objects; GatewayError for anything else."""
        try:
            status, raw = await apiclient.request(
                self._client, "GET", path, deadline_s=self.timeout
            )
        except apiclient.NoAnswer as exc:
            raise GatewayError(self.url, None, str(exc)) from None
        try:
            rows = json.loads(raw)
        except ValueError:
            rows = None
        if status >= 400 or not isinstance(rows, list):
            raise GatewayError(self.url, status, _error_of(status, raw))
        if not all(isinstance(r, dict) for r in rows):
            raise GatewayError(self.url, status, f"HTTP {status}: {path} is not a list of objects")
        return rows


def _error_of(status: int, body: bytes) -> str:
    """What a refusal says: the gateway's `error`, else the status and the body's start
    (a proxy's HTML 502, say)."""
    data = apiclient.json_object(body)
    if data is not None and data.get("error"):
        return str(data["error"])
    text = body[:200].decode("utf-8", "replace").strip() or "no body"
    return f"HTTP {status}: {text}"
