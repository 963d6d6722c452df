"""The gateway's admin API from the console (no Textual here): routes, the measurement
snapshot, failover jobs. The admin token comes from [gateway].token_env."""

from __future__ import annotations

import os
from typing import Any

import httpx

from console.core.config import Fleet


class GatewayError(Exception):
    """The gateway refused or did not answer; str() says why."""


class GatewayClient:
    def __init__(self, fleet: Fleet, timeout: float = 5.0) -> None:
        assert fleet.gateway is not None
        token = os.environ.get(fleet.gateway.token_env, "")
        self.url = fleet.gateway.url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    @staticmethod
    def configured(fleet: Fleet) -> bool:
        return fleet.gateway is not None and bool(os.environ.get(fleet.gateway.token_env))

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            resp = await self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise GatewayError(
                f"gateway {self.url} did not answer ({exc.__class__.__name__})"
            ) from None
        try:
            data = resp.json()
        except ValueError:
            data = {"error": resp.text[:200]}
        if resp.status_code >= 400:
            raise GatewayError(str(data.get("error") if isinstance(data, dict) else data))
        return data

    async def snapshot(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/admin/snapshot")
        return result

    async def failover(self, model: str, to: str, mode: str, why: str) -> dict[str, Any]:
        body = {"model": model, "to": to, "mode": mode, "why": why}
        result: dict[str, Any] = await self._call("POST", "/admin/failover", body)
        return result

    async def plan(self, model: str, to: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", "/admin/failover/plan", {"model": model, "to": to}
        )
        return result

    async def job(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/admin/jobs/{job_id}")
        return result
