"""Jobs on the agent: long operations, each an asyncio task with steps, saved as it goes.

Kinds (POST /v1/jobs; the request models are in console.core.wire, so /openapi.json
documents each):

    {"kind": "vllm.start", "profile": P, "overrides": {...}}   engine.py
    {"kind": "engine.stop", "engine": ID}                       engine.py
    {"kind": "engine.restart", "engine": ID}                    engine.py
    {"kind": "drill.run", "drill": NAME}                        ../drills/job.py

The runner holds a registry from kind to its handler (a JobKind, console.agent.jobs.kinds).
It parses the request, hands it to the kind's handler, and audits a refusal (JobRefused:
422, 404 or 409) before anything starts. An accepted job is written to the store at once
and after every step, through the JobContext its work is given, so a console that
reconnects, or a restarted agent, sees where it stands. A restarted agent asks each
job's handler to resume it or to clean up after it, and marks the rest failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from console.agent.api.auth import secret_env_names
from console.agent.drills.job import DrillRunner
from console.agent.drills.staleness import TrtStaleness
from console.agent.jobs.engine import EngineJobs
from console.agent.jobs.kinds import Active, JobContext, JobKind, JobRefused, StepFailed, Work
from console.agent.jobs.statelock import StateLock
from console.agent.jobs.store import FINAL, JobEnded, JobRecord, Store
from console.agent.snapshot.gpu_inventory import GpuInventory
from console.agent.snapshot.node import NodeAgent
from console.agent.supervise.supervisor import Supervisor
from console.core.wire import JOB_KINDS, Job, JobRequest, JobStep, VllmStart

__all__ = ["JobRefused", "JobRunner"]

log = logging.getLogger(__name__)

RECENT_S = 600.0  # finished jobs stay in the snapshot this long
REQUEST = TypeAdapter(JobRequest)


class JobRunner:
    def __init__(
        self,
        agent: NodeAgent,
        store: Store,
        supervisor: Supervisor,
        state_lock: StateLock | None = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.supervisor = supervisor
        self.state_lock = state_lock  # held from open() to close(): one agent per folder
        self.active: dict[str, Active] = {}
        self._lock = asyncio.Lock()  # one submission at a time: preflight then spawn
        self.agent_closing = False  # set by close(): open jobs stay open for the next agent
        self.engines = EngineJobs(self)
        self.trt = TrtStaleness(self, supervisor.root.parent)
        self.drills = DrillRunner(self, supervisor.root.parent, self.trt)
        handlers: tuple[JobKind, ...] = (self.engines, self.drills)
        self.kinds: dict[str, JobKind] = {k: h for h in handlers for k in h.kinds}
        assert set(self.kinds) == set(JOB_KINDS), "every wire kind has a handler"

    @classmethod
    def open(cls, agent: NodeAgent) -> JobRunner:
        """The runner over the node's state directory: STATE_DIR/NODE/{jobs.sqlite,engines/}.

        Takes the folder's lock first (StateLocked if another agent holds it): nothing is
        read, adopted or settled by an agent that does not hold it."""
        settings = agent.fleet.agent
        root = Path(settings.state_dir).expanduser() / agent.node
        lock = StateLock.take(root)
        agent.inventory = GpuInventory(root / "gpus.json")
        try:
            return cls(
                agent,
                Store(root / "jobs.sqlite"),
                Supervisor(
                    root,
                    settings.engine_log_max_bytes,
                    settings.engine_log_keep,
                    hidden=secret_env_names(agent.fleet),
                ),
                lock,
            )
        except BaseException:
            lock.release()
            raise

    # -- startup and shutdown ---------------------------------------------------------

    async def start(self) -> None:
        """Adopt the engines a previous agent started; settle the jobs it left open."""
        self.engines.adopt()
        for record in self.store.interrupted():
            handler = self.kinds.get(record.kind)
            if handler is not None and handler.resume(record):
                continue
            why = "the agent stopped while this job ran"
            if handler is not None:
                why += "".join(f"; {note}" for note in handler.interrupted(record))
            stored = dict(record.result or {})
            stored["steps"] = [
                {**step, "state": "failed" if step.get("state") == "running" else "skipped"}
                if step.get("state") in ("running", "pending")
                else step
                for step in stored.get("steps", [])
            ]
            try:
                self.store.update_job(record.id, "failed", {**stored, "error": why})
            except JobEnded:
                log.warning("job %s was settled by another writer", record.id)
        self.trt.start()

    async def close(self) -> None:
        """Stop watching (the engines keep running; the next agent re-adopts them)."""
        self.agent_closing = True
        await self.trt.close()
        for active in list(self.active.values()):
            if active.task is not None:
                active.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await active.task
        self.store.close()
        if self.state_lock is not None:
            self.state_lock.release()

    # -- reading ----------------------------------------------------------------------

    def job(self, job_id: str) -> Job | None:
        active = self.active.get(job_id)
        if active is not None:
            return self._view(active)
        record = self.store.job(job_id)
        return None if record is None else _stored_view(record)

    def jobs(self, limit: int = 100) -> list[Job]:
        return [
            self._view(self.active[r.id]) if r.id in self.active else _stored_view(r)
            for r in self.store.jobs(limit)
        ]

    def recent(self) -> list[Job]:
        """What the snapshot carries: every open job, and those that ended in 10 minutes."""
        now = time.time()
        return [
            j for j in self.jobs(20) if j.state not in FINAL or now - (j.updated or 0) < RECENT_S
        ]

    def engine_busy(self, engine_id: str) -> bool:
        """Whether a job of this agent is under way on the engine (its exit is asked for)."""
        return any(a.engine_id == engine_id for a in self.active.values())

    def log_path(self, job_id: str) -> Path | None:
        job = self.job(job_id)
        handler = None if job is None else self.kinds.get(job.kind)
        return None if job is None or handler is None else handler.log_path(job)

    # -- submitting -------------------------------------------------------------------

    async def plan(self, body: dict[str, Any]) -> dict[str, Any]:
        """What a vllm.start would run and whether its preflight passes; starts nothing."""
        if body.get("kind") != "vllm.start":
            raise JobRefused(422, "only vllm.start can be planned")
        request = parse(body)
        assert isinstance(request, VllmStart)
        return await self.engines.plan(request)

    async def submit(self, body: dict[str, Any], who: str) -> Job:
        kind = body.get("kind")
        async with self._lock:
            try:
                request = parse(body)
                return self._view(await self.kinds[request.kind].submit(request, who))
            except JobRefused as exc:
                self.store.audit(
                    who, f"job {kind} refused", _public(body), {"error": str(exc), **exc.extra}
                )
                raise

    async def cancel(self, job_id: str, who: str) -> Job:
        active = self.active.get(job_id)
        if active is None:
            record = self.store.job(job_id)
            if record is None:
                raise JobRefused(404, f"no job {job_id!r}")
            raise JobRefused(409, f"job {job_id} already ended ({record.state})")
        # Audited when asked: a cancel that stops an engine can take its grace period.
        self.store.audit(who, f"job {active.record.kind} cancel", {"id": job_id})
        if active.task is not None:
            active.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await active.task
        return self._view(active)

    # -- running ----------------------------------------------------------------------

    def run(self, active: Active, work: Work, log: Path | None = None) -> JobContext:
        """Run a job kind's work as a task; its context saves every change."""
        ctx = JobContext(active, self._save, log)
        self.active[active.record.id] = active
        active.state = "running"
        self._save(active)
        active.task = asyncio.create_task(self._guard(ctx, work), name=active.record.id)
        return ctx

    async def _guard(self, ctx: JobContext, work: Work) -> None:
        active = ctx.active
        try:
            await work(ctx)
            active.state = "succeeded"
        except StepFailed as exc:
            active.state, active.error = "failed", str(exc)
            active.result.update(exc.result)
        except asyncio.CancelledError:
            if self.agent_closing:
                return  # the agent stops: the job stays open for the next agent
            active.state, active.error = "cancelled", "cancelled by an operator"
            await self.kinds[active.record.kind].cancelled(ctx)
        except Exception as exc:  # a bug here must end the job, not leave it running
            log.exception("job %s failed", active.record.id)
            active.state, active.error = "failed", f"internal error: {exc!r}"[:300]
        for step in active.steps:
            if step.state == "running":
                step.state = "failed" if active.state == "failed" else "cancelled"
                step.ended = time.time()
            elif step.state == "pending":
                step.state = "skipped"
        self._save(active)
        self.active.pop(active.record.id, None)

    # -- persistence and views --------------------------------------------------------

    def _save(self, active: Active) -> None:
        payload = {
            "steps": [s.model_dump() for s in active.steps],
            "result": active.result,
            "error": active.error,
        }
        self.store.update_job(active.record.id, active.state, payload)  # type: ignore[arg-type]

    def _view(self, active: Active) -> Job:
        record = active.record
        return Job(
            id=record.id,
            kind=record.kind,
            state=active.state,  # type: ignore[arg-type]
            who=record.who,
            created=record.created,
            updated=time.time(),
            params=record.params,
            steps=[s.model_copy() for s in active.steps],
            error=active.error,
            result=dict(active.result),
        )


def parse(body: dict[str, Any]) -> Any:
    """The typed request of a POST /v1/jobs body; JobRefused (422) naming the field."""
    kind = body.get("kind")
    if kind not in JOB_KINDS:
        raise JobRefused(422, f"kind: {kind!r} is not a job kind (kinds: {', '.join(JOB_KINDS)})")
    try:
        return REQUEST.validate_python(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"][1:]) or "body"  # [0] is the kind
        if error["type"] == "extra_forbidden":
            raise JobRefused(422, f"{where}: a {kind} job has no such field") from None
        got = repr(error.get("input"))[:60]
        shown = "" if error["type"] == "missing" else f" (got {got})"
        raise JobRefused(422, f"{where}: {error['msg'].lower()}{shown}") from None


def _stored_view(record: JobRecord) -> Job:
    stored = record.result or {}
    return Job(
        id=record.id,
        kind=record.kind,
        state=record.state,
        who=record.who,
        created=record.created,
        updated=record.updated,
        params=record.params,
        steps=[JobStep.model_validate(s) for s in stored.get("steps", [])],
        error=stored.get("error"),
        result=stored.get("result", {}),
    )


def _public(body: dict[str, Any]) -> dict[str, Any]:
    """A request body fit for the audit log (bounded; it holds no secrets by contract)."""
    return {k: v for k, v in list(body.items())[:10] if isinstance(k, str)}
