"""The gateway's calls to a node's agent, for a rollout's operations
(console.gateway.rollouts.runner):
which engine serves a deployment, a job asked for (restart, stop, start, drill) and
followed to its end.

The agent's operator token comes from the gateway's environment (the node's `token_env`
in fleet.toml), as the console's does; the gateway sends it to exactly the agent URL the
fleet file names. Every call has a total deadline and a cap on the answer's size; a job
is followed until it ends or its own limit passes. The gateway imports no agent code: it
speaks the agent's HTTP API (docs/jobs.md), as the console does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from console.core.config.load import Fleet, MissingSecret

CALL_DEADLINE_S = 10.0  # one call, the whole answer read
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # a snapshot or a job: KBs
FOLLOW_EVERY_S = 0.5
FINAL = ("succeeded", "failed", "cancelled")


class AgentError(Exception):
    """The agent refused, did not answer, or its job did not end well; str() says which
    node and why."""


class AgentCalls:
    """One node's agent, over the gateway's HTTP session."""

    def __init__(self, http: aiohttp.ClientSession, fleet: Fleet, node: str) -> None:
        """AgentError when the node has no agent or its token is not in the environment."""
        found = next((n for n in fleet.nodes if n.name == node), None)
        if found is None or found.agent is None:
            raise AgentError(f"node {node}: no agent in the fleet file to act through")
        self.node = node
        self.url = found.agent.rstrip("/")
        self.headers = {"Accept-Encoding": "identity"}
        if found.token_env:
            index = fleet.nodes.index(found)
            try:
                token = fleet.secret(found.token_env, ("nodes", index, "token_env"))
            except MissingSecret as exc:
                raise AgentError(f"node {node}: {exc} (in the gateway's environment)") from None
            self.headers["Authorization"] = f"Bearer {token}"
        self.http = http

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            async with (
                asyncio.timeout(CALL_DEADLINE_S),
                self.http.request(method, self.url + path, json=body, headers=self.headers) as resp,
            ):
                raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
                status = resp.status
        except TimeoutError:
            raise AgentError(
                f"node {self.node}: agent {self.url} did not answer within {CALL_DEADLINE_S:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise AgentError(f"node {self.node}: agent {self.url}: {exc!r}"[:300]) from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise AgentError(f"node {self.node}: {path} answered over {MAX_ANSWER_BYTES} bytes")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        if status >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            raise AgentError(f"node {self.node}: {error or f'HTTP {status}'}"[:500])
        if data is None:
            raise AgentError(f"node {self.node}: {path} answered something that is not JSON")
        return data

    async def engine_of(self, deployment: str) -> str | None:
        """The id of the engine the agent says serves `deployment`; None: none does now."""
        snapshot = await self._call("GET", "/v1/snapshot")
        engines = snapshot.get("engines") if isinstance(snapshot, dict) else None
        for engine in engines if isinstance(engines, list) else []:
            if isinstance(engine, dict) and deployment in (engine.get("deployment_ids") or []):
                return str(engine.get("id"))
        return None

    async def run(
        self, body: dict[str, Any], limit_s: float, started: Callable[[str], None]
    ) -> dict[str, Any]:
        """Ask for the job `body` and follow it to its end (`started` gets its id first, so
        a gateway restarted meanwhile can follow it again). AgentError when it is refused
        or ends other than succeeded, with the agent's words."""
        job = await self._call("POST", "/v1/jobs", body)
        if not isinstance(job, dict) or not isinstance(job.get("id"), str):
            raise AgentError(f"node {self.node}: POST /v1/jobs answered no job id")
        started(job["id"])
        return await self.follow(job["id"], limit_s)

    async def follow(self, job_id: str, limit_s: float) -> dict[str, Any]:
        """Poll job `job_id` until it ends; AgentError unless it succeeded."""
        give_up = time.monotonic() + limit_s
        while True:
            job = await self._call("GET", f"/v1/jobs/{job_id}")
            state = job.get("state") if isinstance(job, dict) else None
            if state == "succeeded":
                return dict(job)
            if state in FINAL:
                why = job.get("error") or state
                raise AgentError(f"node {self.node}: job {job_id} {state}: {why}"[:500])
            if time.monotonic() > give_up:
                raise AgentError(
                    f"node {self.node}: job {job_id} not ended after {limit_s:.0f} s; it goes "
                    f"on on the agent (engineroom jobs --node {self.node})"
                )
            await asyncio.sleep(FOLLOW_EVERY_S)
