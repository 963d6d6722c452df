"""Acting on agents: the jobs API from the console and the CLI (no Textual here).

The console never sends a command line: a profile name and overrides, or an engine id.
The agent refuses what its fleet file does not allow; this module reports the refusal
as it came (`ActionError`, with the failed preflight checks when there are some). The
commands that print jobs (`engineroom vllm`, `jobs`, `drill`) are in console.commands.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from console.collect.clients import apiclient
from console.core.config.load import ConfigError, Fleet, Node
from console.core.gateway_wire import problems
from console.core.snapshot import Job, job_from, plain
from console.core.wire import JobPlan, WhoAmI

M = TypeVar("M", bound=BaseModel)

FINAL = ("succeeded", "failed", "cancelled")
FOLLOW_LIMIT_S = 6 * 3600.0  # past every deadline a job of the agent has (drills: hours)


class ActionError(Exception):
    """The agent refused or could not be asked; str() says why, `status` is the HTTP code
    (None when the agent did not answer)."""

    def __init__(self, message: str, status: int | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


class AgentActions:
    """The jobs API of one node's agent."""

    def __init__(self, fleet: Fleet, node: str, timeout: float = 10.0) -> None:
        self.node: Node = fleet.node(node)
        if self.node.agent is None:
            raise ConfigError(
                f"{fleet.source}: node {node!r} has no agent (it is read over SSH): "
                "starting and stopping engines needs the agent"
            )
        headers = {}
        if self.node.token_env:
            index = fleet.nodes.index(self.node)
            token = fleet.secret(self.node.token_env, ("nodes", index, "token_env"))
            headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout  # per call, the whole answer included
        self._client = apiclient.async_client(self.node.agent.rstrip("/"), headers, timeout)

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            status, raw = await apiclient.request(
                self._client, method, path, json=body, deadline_s=self.timeout
            )
        except apiclient.NoAnswer as exc:
            raise ActionError(
                f"{self.node.name}: agent {self.node.agent} did not answer ({exc})"
            ) from None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past what decodes
            data = {"error": raw[:300].decode(errors="replace")}
        if status >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            extra = (
                {k: v for k, v in data.items() if k != "error"} if isinstance(data, dict) else {}
            )
            raise ActionError(f"{self.node.name}: {error or f'HTTP {status}'}", status, **extra)
        return data

    def _as(self, model: type[M], path: str, data: Any) -> M:
        """The agent's answer as `model`; an ActionError that says what came otherwise."""
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise ActionError(
                f"{self.node.name}: {path} answered something that is not a {model.__name__} "
                f"({problems(exc)})"
            ) from None

    async def whoami(self) -> WhoAmI:
        """What our token may do on this agent: its name, role, and whether it runs jobs."""
        return self._as(WhoAmI, "/v1/whoami", await self._call("GET", "/v1/whoami"))

    async def plan(self, profile: str, overrides: dict[str, Any]) -> JobPlan:
        """What a vllm.start of `profile` would run, and its preflight; starts nothing."""
        body = {"kind": "vllm.start", "profile": profile, "overrides": overrides}
        return self._as(JobPlan, "/v1/jobs/plan", await self._call("POST", "/v1/jobs/plan", body))

    async def start(self, profile: str, overrides: dict[str, Any]) -> Job:
        body = {"kind": "vllm.start", "profile": profile, "overrides": overrides}
        return job_from(await self._call("POST", "/v1/jobs", body))

    async def stop(self, engine: str, restart: bool = False) -> Job:
        kind = "engine.restart" if restart else "engine.stop"
        return job_from(await self._call("POST", "/v1/jobs", {"kind": kind, "engine": engine}))

    async def drill(self, name: str) -> Job:
        return job_from(await self._call("POST", "/v1/jobs", {"kind": "drill.run", "drill": name}))

    async def report(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/v1/jobs/{job_id}/report")
        return result

    async def what_if(self, change: dict[str, Any]) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("POST", "/v1/drills/what-if", change)
        return result

    async def cancel(self, job_id: str) -> Job:
        return job_from(await self._call("DELETE", f"/v1/jobs/{job_id}"))

    async def job(self, job_id: str) -> Job:
        return job_from(await self._call("GET", f"/v1/jobs/{job_id}"))

    async def jobs(self, limit: int = 50) -> list[Job]:
        return [job_from(j) for j in await self._call("GET", f"/v1/jobs?limit={limit}")]

    async def log(self, job_id: str, tail: int = 20) -> list[str]:
        try:
            status, raw = await apiclient.request(
                self._client,
                "GET",
                f"/v1/jobs/{job_id}/log",
                params={"tail": tail},
                deadline_s=self.timeout,
            )
        except apiclient.NoAnswer:
            return []
        return raw.decode(errors="replace").splitlines() if status == 200 else []

    async def follow(
        self,
        job_id: str,
        on_change: Callable[[Job], None],
        interval: float = 0.5,
        limit_s: float = FOLLOW_LIMIT_S,
    ) -> Job:
        """Poll the job until it ends, calling `on_change` whenever it moved. The agent
        holds every job to its own deadlines; `limit_s` bounds the wait should it not."""
        seen: str | None = None
        give_up = time.monotonic() + limit_s
        while True:
            if time.monotonic() > give_up:
                raise ActionError(
                    f"{self.node.name}: job {job_id} still not ended after {limit_s:.0f} s; "
                    f"it goes on on the agent (engineroom jobs --node {self.node.name})"
                )
            job = await self.job(job_id)
            key = json.dumps([job.state, plain(job.steps)], default=str)
            if key != seen:
                seen = key
                on_change(job)
            if job.state in FINAL:
                return job
            await asyncio.sleep(interval)
