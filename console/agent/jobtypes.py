"""What the job runner (console.agent.jobs) and the drill runner (console.agent.drills)
share: a running job, the two ways a job does not succeed, and the readiness check of an
OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from console.agent.store import JobRecord
from console.core.fetch import FetchError, fetch
from console.core.wire import JobStep


class JobRefused(Exception):
    """A job that was not started; `status` is the HTTP code, str() says why."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


class StepFailed(Exception):
    def __init__(self, message: str, **result: Any) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class Active:
    """A job this agent is running: its live steps and result, saved at every change."""

    record: JobRecord
    steps: list[JobStep]
    result: dict[str, Any] = field(default_factory=dict)
    state: str = "queued"
    error: str | None = None
    task: asyncio.Task[None] | None = None
    engine_id: str | None = None
    gpus: tuple[int, ...] = ()  # held for this job until it ends (a start or restart)

    def step(self, name: str) -> JobStep:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)


async def ready(http: Any, endpoint: str, served: str) -> bool:
    """The engine answers /health with 200 and /v1/models lists `served`."""
    try:
        health = await fetch(http, endpoint + "/health", timeout=1.0, max_bytes=4096)
        if health.status != 200:
            return False
        models = await fetch(http, endpoint + "/v1/models", timeout=1.0, max_bytes=1 << 20)
        data = models.json().get("data", []) if models.status == 200 else []
    except (FetchError, AttributeError):
        return False
    return any(isinstance(m, dict) and m.get("id") == served for m in data)
