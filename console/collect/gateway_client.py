"""The gateway's admin API from the console (no Textual here): routes, the measurement
snapshot, failover jobs. The admin token comes from [gateway].token_env; the client
takes nothing from the environment besides (no proxy: console/collect/apiclient.py)."""

from __future__ import annotations

import json
import os
from typing import Any

from console.collect import apiclient
from console.core.config import Fleet


class GatewayError(Exception):
    """The gateway refused or did not answer; str() says why."""


class GatewayClient:
    def __init__(self, fleet: Fleet, timeout: float = 5.0) -> None:
        assert fleet.gateway is not None
        token = os.environ.get(fleet.gateway.token_env, "")
        self.url = fleet.gateway.url.rstrip("/")
        self.timeout = timeout  # per call, the whole answer included
        self._client = apiclient.async_client(
            self.url, {"Authorization": f"Bearer {token}"}, timeout
        )

    @staticmethod
    def configured(fleet: Fleet) -> bool:
        return fleet.gateway is not None and bool(os.environ.get(fleet.gateway.token_env))

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            status, raw = await apiclient.request(
                self._client, method, path, json=body, deadline_s=self.timeout
            )
        except apiclient.NoAnswer as exc:
            raise GatewayError(f"gateway {self.url} did not answer ({exc})") from None
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"error": f"HTTP {status}: {raw[:200].decode(errors='replace')}"}
        if status >= 400:
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
