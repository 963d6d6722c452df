"""What the job runner (console.agent.jobs.runner) and each kind of job share: a running job,
the context its work is given, the interface of a job kind, what a kind may ask of the
runner (JobHost), the two ways a job does not succeed, and the readiness check of an
OpenAI-compatible server.

A job kind (console.agent.jobs.engine, console.agent.drills.job) is registered with the runner
under its kind names. The runner parses the request, audits a refusal, runs the work as
an asyncio task, and saves the job at every change; the kind checks the request, names
the steps, and does the work through its JobContext: begin, end or skip a step, record a
gate, save the result, write to the job's log. A kind reaches back to the runner only
through JobHost, so the runner's module is never imported by the kinds it registers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from console.agent.jobs.store import JobRecord, Store
from console.agent.snapshot.node import NodeAgent
from console.agent.supervise.supervisor import Supervisor
from console.core.fetch import FetchError, fetch
from console.core.wire import Gate, Job, JobStep


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


class JobContext:
    """What a job's work is given: its steps and result, each change saved at once (a
    console that reconnects, or a restarted agent, sees where the job stands)."""

    def __init__(
        self, active: Active, save: Callable[[Active], None], log: Path | None = None
    ) -> None:
        self.active = active
        self._save = save
        self.log_path = log  # the job's own log, where it has one (a drill's)

    @property
    def id(self) -> str:
        return self.active.record.id

    @property
    def record(self) -> JobRecord:
        return self.active.record

    @property
    def result(self) -> dict[str, Any]:
        return self.active.result

    def step(self, name: str) -> JobStep:
        return self.active.step(name)

    def begin(self, name: str) -> JobStep:
        step = self.active.step(name)
        step.state, step.started = "running", step.started or time.time()
        self.save()
        return step

    def end(self, step: JobStep, detail: str | None = None) -> None:
        step.state, step.ended = "succeeded", time.time()
        if detail is not None:
            step.detail = detail
        self.save()

    def skip(self, name: str, why: str) -> None:
        step = self.active.step(name)
        step.state, step.detail = "skipped", why
        step.started = step.ended = time.time()
        self.save()

    def gate(self, name: str, ok: bool, detail: str) -> None:
        """A pass/fail judgement the job's report lists (result["gates"])."""
        gate = Gate(gate=name, ok=ok, detail=detail)
        self.active.result.setdefault("gates", []).append(gate.model_dump())
        self.save()

    def save(self) -> None:
        self._save(self.active)

    def log(self, text: str) -> int:
        """A header line in the job's log; the offset where what follows it starts."""
        assert self.log_path is not None, "this job has no log of its own"
        with self.log_path.open("ab") as f:
            f.write(f"--- {time.strftime('%H:%M:%S')} {text} ---\n".encode())
            return f.tell()


Work = Callable[[JobContext], Awaitable[None]]


class JobHost(Protocol):
    """What a job kind may use of the runner that registered it (console.agent.jobs.runner)."""

    agent: NodeAgent
    store: Store
    supervisor: Supervisor
    active: dict[str, Active]  # the jobs running now, by id

    def run(self, active: Active, work: Work, log: Path | None = None) -> JobContext:
        """Run the work as the job's task; its context saves every change."""
        ...


class JobKind(Protocol):
    """One or more kinds of job (their names in `kinds`), registered with the runner."""

    kinds: tuple[str, ...]

    async def submit(self, request: Any, who: str) -> Active:
        """Check the request (JobRefused if it may not run), then run it (JobHost.run)."""
        ...

    def log_path(self, job: Job) -> Path | None:
        """The log `GET /v1/jobs/ID/log` streams."""
        ...

    def resume(self, record: JobRecord) -> bool:
        """A job the last agent left open: go on with it if possible (True)."""
        ...

    def interrupted(self, record: JobRecord) -> list[str]:
        """A job the last agent left open that cannot go on: clean up after it; what was
        found or done, for its error."""
        ...

    async def cancelled(self, ctx: JobContext) -> None:
        """An operator cancelled the job: leave nothing half-started behind."""
        ...


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
