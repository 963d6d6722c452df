"""Jobs on the agent: start, stop and restart engines, each an asyncio task with steps.

Kinds (POST /v1/jobs):

    {"kind": "vllm.start", "profile": P, "overrides": {...}}   preflight, spawn, load
    {"kind": "engine.stop", "engine": ID}                       stop (drain, then SIGKILL)
    {"kind": "engine.restart", "engine": ID}                    stop, preflight, spawn, load
    {"kind": "drill.run", "drill": NAME}                        a rebuild drill (drills.py)

A request the profile does not allow, or whose preflight fails, is refused (JobRefused,
422) before anything starts; the refusal is audited. The GPUs of an accepted start (or
restart) are held for it until the job ends (another start on them: 409): the preflight
and the spawn are a model load apart, and NVML shows an engine on its GPU only once it
has loaded. An accepted job is written to the store at once and after every step, so a
console that reconnects, or a restarted agent, sees where it stands. The engine itself
runs in its own session (console.agent.supervisor) and outlives the agent; a restarted
agent re-adopts it and, if the start job was still waiting for it to load, goes on
waiting.

The cold start is measured from the spawn to ready (`/health` answers 200 and
`/v1/models` lists the served name), and split into phases from vLLM's log lines as
they appear. A phase whose line never appears stays null: not every build logs each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from console.agent import preflight
from console.agent.auth import secret_env_names
from console.agent.discovery import EngineProcess, alive
from console.agent.drills import DrillRunner
from console.agent.engines import engine_id as make_engine_id
from console.agent.jobtypes import Active, JobRefused, StepFailed, ready
from console.agent.launch import Launch, LaunchError, vllm_launch
from console.agent.node import NodeAgent
from console.agent.signals import terminate
from console.agent.statelock import StateLock
from console.agent.store import FINAL, JobEnded, JobRecord, Store
from console.agent.supervisor import Managed, Supervisor, log_tail
from console.core.config import Profile
from console.core.fetch import new_session
from console.core.wire import COLD_START_PHASES, Job, JobStep
from plugins.base import Discovered, EngineTarget, local_url

log = logging.getLogger(__name__)

KINDS = ("vllm.start", "engine.stop", "engine.restart", "drill.run")
READY_POLL_S = 0.1
LOG_TAIL_LINES = 30
RECENT_S = 600.0  # finished jobs stay in the snapshot this long
UNMANAGED_GRACE_S = 30.0  # SIGTERM to SIGKILL for an engine without a profile
SETTLE_CYCLES = 3  # snapshot cycles a ready engine may take to show as ready in the snapshot

# vLLM's log lines that mark the cold-start phases, first match wins (V1 engine, 0.8-0.32).
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine_init", ("Initializing a V1 LLM engine", "Initializing an LLM engine")),
    ("weights_loaded", ("Loading weights took", "Model loading took")),
    ("kv_cache_allocated", ("KV cache size:", "init engine (profile, create kv cache")),
    ("graphs_captured", ("Graph capturing finished",)),
    ("server_up", ("Starting vLLM server on", "Starting vLLM API server", "startup complete")),
)


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
        self.drills = DrillRunner(self, supervisor.root.parent)

    @classmethod
    def open(cls, agent: NodeAgent) -> JobRunner:
        """The runner over the node's state directory: STATE_DIR/NODE/{jobs.sqlite,engines/}.

        Takes the folder's lock first (StateLocked if another agent holds it): nothing is
        read, adopted or settled by an agent that does not hold it."""
        settings = agent.fleet.agent
        root = Path(settings.state_dir).expanduser() / agent.node
        lock = StateLock.take(root)
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
        running, gone = self.supervisor.adopt()
        for adopted in running:
            self._track(adopted)
            log.warning("re-adopted %s (pid %s)", adopted.engine_id, adopted.pgid)
        exits = {engine: status for engine, status in gone}
        for record in self.store.interrupted():
            managed = next((m for m in running if m.job_id == record.id), None)
            if managed is not None and record.kind in ("vllm.start", "engine.restart"):
                self._resume_load(record, managed)
                continue
            why = "the agent stopped while this job ran"
            if record.kind == "drill.run":
                killed = self.drills.cleanup_interrupted((record.result or {}).get("result", {}))
                why += "".join(f"; {k}" for k in killed)
            engine = record.params.get("engine") or (record.result or {}).get("engine_id")
            if isinstance(engine, str) and engine in exits:
                code = exits[engine].get("exit_code")
                why += f"; engine {engine} is gone (exit code {code if code is not None else '?'})"
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
        self.drills.start()

    async def close(self) -> None:
        """Stop watching (the engines keep running; the next agent re-adopts them)."""
        self.agent_closing = True
        await self.drills.close()
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

    def log_path(self, job_id: str) -> Path | None:
        job = self.job(job_id)
        if job is None:
            return None
        if job.kind == "drill.run":
            return self.drills.log_path(job_id)
        engine = job.result.get("engine_id") or job.params.get("engine")
        return self.supervisor.root / engine / "engine.log" if isinstance(engine, str) else None

    # -- submitting -------------------------------------------------------------------

    async def plan(self, body: dict[str, Any]) -> dict[str, Any]:
        """What a vllm.start would run and whether its preflight passes; starts nothing."""
        if body.get("kind") != "vllm.start":
            raise JobRefused(422, "only vllm.start can be planned")
        name, profile, launch, endpoint, engine = self._launch(body)
        checks = await self._preflight(launch, profile, engine)
        if (held := self._held(launch.gpus)) is not None:
            checks.insert(0, preflight.Check("gpus", False, held))
        return {
            "profile": name,
            "engine_id": engine,
            "endpoint": endpoint,
            "argv": list(launch.argv),
            "env": launch.env,
            "checks": [c.to_json() for c in checks],
            "ok": all(c.ok for c in checks),
        }

    async def submit(self, body: dict[str, Any], who: str) -> Job:
        kind = body.get("kind")
        async with self._lock:
            try:
                if kind not in KINDS:
                    raise JobRefused(
                        422, f"kind: {kind!r} is not a job kind (kinds: {', '.join(KINDS)})"
                    )
                if kind == "vllm.start":
                    return await self._submit_start(body, who)
                if kind == "drill.run":
                    return self._view(await self.drills.submit(body, who))
                return await self._submit_stop(body, who, restart=kind == "engine.restart")
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
        if active.task is not None:
            active.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await active.task
        self.store.audit(who, f"job {active.record.kind} cancel", {"id": job_id})
        return self._view(active)

    def _launch(self, body: dict[str, Any]) -> tuple[str, Profile, Launch, str, str]:
        name = body.get("profile")
        if not isinstance(name, str) or name not in self.agent.fleet.profiles:
            known = ", ".join(
                n for n, p in self.agent.fleet.profiles.items() if p.node == self.agent.node
            )
            raise JobRefused(
                422, f"profile: no profile {name!r} for node {self.agent.node} ({known or 'none'})"
            )
        profile = self.agent.fleet.profiles[name]
        if profile.node != self.agent.node:
            raise JobRefused(
                422, f"profile: {name} is for node {profile.node}, this is {self.agent.node}"
            )
        overrides = body.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise JobRefused(422, "overrides: wants an object of KEY: VALUE")
        try:
            launch = vllm_launch(profile, overrides)
        except LaunchError as exc:
            raise JobRefused(422, str(exc)) from None
        host = launch.args.get("host")
        endpoint = local_url(host if isinstance(host, str) else None, launch.port)
        return name, profile, launch, endpoint, make_engine_id(profile.engine, endpoint)

    async def _preflight(
        self, launch: Launch, profile: Profile, engine: str
    ) -> list[preflight.Check]:
        gpus, gpu_status = await self.agent.fresh_gpus()
        running = None
        busy = self._busy(engine)
        if busy is not None:
            running = f"{engine} has a job running ({busy})"
        elif (managed := self.supervisor.engines.get(engine)) is not None and managed.alive():
            running = f"{engine} is already running (started by job {managed.job_id})"
        return await asyncio.to_thread(preflight.run, launch, profile, gpus, gpu_status, running)

    def _busy(self, engine: str) -> str | None:
        for job_id, active in self.active.items():
            if active.engine_id == engine:
                return job_id
        return None

    def _held(self, gpus: tuple[int, ...], but: str | None = None) -> str | None:
        """Which open job or running engine (other than engine `but`) holds one of `gpus`."""
        for job_id, active in self.active.items():
            if (shared := sorted(set(gpus) & set(active.gpus))) and active.engine_id != but:
                return (
                    f"GPU {', '.join(map(str, shared))} is held by job {job_id} "
                    f"({active.record.kind} of {active.engine_id}, {active.state})"
                )
        for engine, managed in self.supervisor.engines.items():
            if (
                (shared := sorted(set(gpus) & set(managed.gpus)))
                and engine != but
                and managed.alive()
            ):
                return (
                    f"GPU {', '.join(map(str, shared))} is held by engine {engine} "
                    f"(started by job {managed.job_id})"
                )
        return None

    async def _submit_start(self, body: dict[str, Any], who: str) -> Job:
        name, profile, launch, endpoint, engine = self._launch(body)
        if (held := self._held(launch.gpus)) is not None:
            raise JobRefused(409, f"gpus: {held}")
        checks = await self._preflight(launch, profile, engine)
        if not all(c.ok for c in checks):
            raise JobRefused(
                422,
                f"preflight failed: {preflight.failures(checks)}",
                checks=[c.to_json() for c in checks],
            )
        params = {"profile": name, "overrides": body.get("overrides") or {}}
        record = self.store.create_job("vllm.start", who, params)
        now = time.time()
        active = Active(
            record,
            [
                JobStep(
                    name="preflight",
                    state="succeeded",
                    started=now,
                    ended=now,
                    detail="; ".join(f"{c.name}: {c.detail}" for c in checks),
                ),
                JobStep(name="spawn"),
                JobStep(name="load"),
            ],
            result={"engine_id": engine, "endpoint": endpoint, "argv": list(launch.argv)},
            engine_id=engine,
            gpus=launch.gpus,  # held until the job ends (_held)
        )
        self._run(active, self._start_engine(active, name, profile, launch, endpoint))
        return self._view(active)

    async def _submit_stop(self, body: dict[str, Any], who: str, *, restart: bool) -> Job:
        engine = body.get("engine")
        kind = "engine.restart" if restart else "engine.stop"
        entry = self.agent.engines.tracked.get(engine) if isinstance(engine, str) else None
        managed = self.supervisor.engines.get(engine) if isinstance(engine, str) else None
        if entry is None and managed is None:
            raise JobRefused(404, f"engine: no engine {engine!r} on {self.agent.node}")
        assert isinstance(engine, str)
        if (busy := self._busy(engine)) is not None:
            raise JobRefused(409, f"engine: {engine} has a job running ({busy})")
        if managed is None and (entry is None or entry.process is None):
            raise JobRefused(
                422, f"engine: {engine} has no process on this node that the agent knows"
            )
        if managed is None and entry is not None and entry.process is not None:
            proc = entry.process
            if not alive(proc.pid, proc.create_time):
                raise JobRefused(
                    409, f"engine: {engine}'s process {proc.pid} has exited; nothing to stop"
                )
        if restart and managed is None:
            raise JobRefused(
                422,
                f"engine: {engine} was not started by this agent, so there is no launch "
                "profile to restart it with; stop it, then start a profile",
            )
        gpus: tuple[int, ...] = ()
        if restart and managed is not None:
            # The engine's GPUs stay held from its stop to its new start.
            gpus = tuple(managed.gpus)
            with contextlib.suppress(JobRefused):
                gpus = self._launch({"profile": managed.profile, "overrides": managed.overrides})[
                    2
                ].gpus
            if (held := self._held(gpus, but=engine)) is not None:
                raise JobRefused(409, f"gpus: {held}")
        record = self.store.create_job(kind, who, {"engine": engine})
        steps = [JobStep(name="stop")]
        if restart:
            steps += [JobStep(name="preflight"), JobStep(name="spawn"), JobStep(name="load")]
        active = Active(record, steps, result={"engine_id": engine}, engine_id=engine, gpus=gpus)
        self._run(active, self._stop_engine(active, engine, managed, restart=restart))
        return self._view(active)

    # -- running ----------------------------------------------------------------------

    def _run(self, active: Active, work: Any) -> None:
        self.active[active.record.id] = active
        active.state = "running"
        self._save(active)
        active.task = asyncio.create_task(self._guard(active, work), name=active.record.id)

    async def _guard(self, active: Active, work: Any) -> None:
        try:
            await work
            active.state = "succeeded"
        except StepFailed as exc:
            active.state, active.error = "failed", str(exc)
            active.result.update(exc.result)
        except asyncio.CancelledError:
            if self.agent_closing:
                return  # the agent stops: the job stays open for the next agent
            active.state, active.error = "cancelled", "cancelled by an operator"
            await self._cleanup_cancelled(active)
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

    async def _cleanup_cancelled(self, active: Active) -> None:
        """A cancelled start leaves no engine behind."""
        if active.record.kind in ("vllm.start", "engine.restart") and active.engine_id:
            managed = self.supervisor.engines.get(active.engine_id)
            if managed is not None and active.step("load").state in ("running", "pending"):
                with contextlib.suppress(Exception):
                    how = await self.supervisor.stop(managed, self._grace(managed))
                    active.result["stopped"] = how
                    self.supervisor.forget(managed.engine_id)
                    await self.agent.engines.release(managed.engine_id)

    def _begin(self, active: Active, name: str) -> JobStep:
        step = active.step(name)
        step.state, step.started = "running", step.started or time.time()
        self._save(active)
        return step

    def _end(self, active: Active, step: JobStep, detail: str | None = None) -> None:
        step.state, step.ended = "succeeded", time.time()
        if detail is not None:
            step.detail = detail
        self._save(active)

    async def _start_engine(
        self, active: Active, name: str, profile: Profile, launch: Launch, endpoint: str
    ) -> None:
        engine = active.engine_id
        assert engine is not None
        step = self._begin(active, "spawn")
        try:
            managed = await asyncio.to_thread(
                self.supervisor.spawn,
                engine,
                profile.engine,
                name,
                dict(active.record.params.get("overrides") or {}),
                launch,
                endpoint,
                profile.served_model_name,
                active.record.id,
            )
        except OSError as exc:
            step.detail = str(exc)
            raise StepFailed(f"spawn: {exc}") from None
        self._track(managed)
        self._end(active, step, f"session leader pid {managed.pgid}; log {managed.log_path}")
        await self._load(active, managed, profile.ready_timeout_s, profile.stop_grace_s)

    async def _load(
        self, active: Active, managed: Managed, timeout_s: float, grace_s: float
    ) -> None:
        step = self._begin(active, "load")
        t0 = managed.started  # wall clock of the spawn, so a re-adopting agent agrees
        phases: dict[str, float | None] = dict.fromkeys(COLD_START_PHASES)
        if isinstance(active.result.get("cold_start"), dict):
            phases.update(active.result["cold_start"].get("phases", {}))
        active.result["cold_start"] = {"phases": phases, "total_s": None}
        offset = managed.log_offset
        async with new_session(limit=2) as http:
            while True:
                offset, lines = await asyncio.to_thread(new_lines, managed.log_path, offset)
                seen = time.time() - t0
                changed = False
                for line in lines:
                    for phase, markers in PHASES:
                        if phases[phase] is None and any(m in line for m in markers):
                            phases[phase] = round(seen, 3)
                            changed = True
                if changed:
                    step.detail = _phase_text(phases)
                    self._save(active)
                if not managed.alive():
                    code = managed.exit_code()
                    tail = log_tail(managed.log_path, LOG_TAIL_LINES)
                    self.supervisor.forget(managed.engine_id)
                    raise StepFailed(
                        f"load: the engine exited with code "
                        f"{code if code is not None else 'unknown'} before it was ready",
                        log_tail=tail,
                        exit_code=code,
                    )
                if await ready(http, managed.endpoint, managed.served_model_name):
                    total = round(time.time() - t0, 3)
                    phases["ready"] = total
                    active.result["cold_start"] = {"phases": phases, "total_s": total}
                    shown = await self._settle(managed.engine_id)
                    active.result["snapshot_state"] = shown
                    self._end(
                        active,
                        step,
                        f"ready in {total:.1f} s; "
                        + _phase_text(phases)
                        + ("" if shown == "ready" else f"; the snapshot still says {shown}"),
                    )
                    return
                if time.time() - t0 > timeout_s:
                    how = await self.supervisor.stop(managed, grace_s)
                    self.supervisor.forget(managed.engine_id)
                    await self.agent.engines.release(managed.engine_id)
                    raise StepFailed(
                        f"load: not ready within {timeout_s:g} s; stopped it ({how})",
                        log_tail=log_tail(managed.log_path, LOG_TAIL_LINES),
                    )
                await asyncio.sleep(READY_POLL_S)

    async def _settle(self, engine_id: str) -> str | None:
        """Wait, a few snapshot cycles at most, until the agent's own snapshot shows the
        engine ready: a `check` run right after the job says ready then reads ready too.
        The engine's state in the newest snapshot (None: not in it)."""
        settings = self.agent.settings
        deadline = time.monotonic() + SETTLE_CYCLES * settings.scrape_interval_s
        deadline += settings.probe_timeout_s
        snap = self.agent.latest
        while True:
            engines = snap.engines if snap is not None else []
            shown = next((e.state for e in engines if e.id == engine_id), None)
            left = deadline - time.monotonic()
            if shown == "ready" or left <= 0:
                return shown
            try:
                snap = await asyncio.wait_for(self.agent.next_snapshot(snap), left)
            except TimeoutError:
                return shown

    def _resume_load(self, record: JobRecord, managed: Managed) -> None:
        stored = record.result or {}
        steps = [JobStep.model_validate(s) for s in stored.get("steps", [])]
        active = Active(
            record,
            steps,
            stored.get("result", {}),
            engine_id=managed.engine_id,
            gpus=tuple(managed.gpus),
        )
        note = "the agent restarted during the load and re-adopted the engine"
        profile = self.agent.fleet.profiles.get(managed.profile)
        timeout = profile.ready_timeout_s if profile else 900.0
        grace = profile.stop_grace_s if profile else 30.0
        active.result["note"] = note
        self._run(active, self._load(active, managed, timeout, grace))

    async def _stop_engine(
        self, active: Active, engine: str, managed: Managed | None, *, restart: bool
    ) -> None:
        step = self._begin(active, "stop")
        if managed is not None:
            how = await self.supervisor.stop(managed, self._grace(managed))
            self.supervisor.forget(engine)
        else:
            how = await self._stop_unmanaged(engine)
        await self.agent.engines.release(engine)
        self._end(active, step, how)
        if not restart:
            return
        assert managed is not None
        body = {"profile": managed.profile, "overrides": managed.overrides}
        step = self._begin(active, "preflight")
        try:
            name, profile, launch, endpoint, _ = self._launch(body)
        except JobRefused as exc:
            raise StepFailed(f"preflight: {exc}") from None
        checks = await self._preflight(launch, profile, "")
        detail = "; ".join(f"{c.name}: {c.detail}" for c in checks)
        if not all(c.ok for c in checks):
            step.detail = detail
            raise StepFailed(f"preflight failed: {preflight.failures(checks)}")
        self._end(active, step, detail)
        active.result.update(argv=list(launch.argv), endpoint=endpoint)
        await self._start_engine(active, name, profile, launch, endpoint)

    async def _stop_unmanaged(self, engine: str) -> str:
        """An engine this agent did not start (found among the processes), by its pid and
        the start time it was found with (console.agent.signals.terminate)."""
        proc = self.agent.engines.tracked[engine].process
        assert proc is not None
        return await terminate(proc.pid, proc.create_time, UNMANAGED_GRACE_S)

    def _grace(self, managed: Managed) -> float:
        profile = self.agent.fleet.profiles.get(managed.profile)
        return profile.stop_grace_s if profile is not None else 30.0

    def _track(self, managed: Managed) -> None:
        target = EngineTarget(
            id=managed.engine_id,
            kind=managed.kind,
            endpoint=managed.endpoint,
            metrics_endpoint=managed.endpoint + "/metrics",
            engine_models=[managed.served_model_name],
        )
        process = EngineProcess(
            managed.kind,
            managed.pgid,
            managed.leader_created,
            managed.argv,
            Discovered(endpoint=managed.endpoint, metrics_endpoint=target.metrics_endpoint),
        )
        self.agent.engines.manage(target, process, managed.profile)

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


def new_lines(path: Path, offset: int) -> tuple[int, list[str]]:
    """Complete lines appended to `path` since `offset` (restarts at 0 after a rotation)."""
    try:
        size = path.stat().st_size
        if size < offset:
            offset = 0
        if size == offset:
            return offset, []
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(min(size - offset, 4 << 20))
    except OSError:
        return offset, []
    end = data.rfind(b"\n") + 1
    return offset + end, data[:end].decode(errors="replace").splitlines()


def _phase_text(phases: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {v:.1f} s" for k, v in phases.items() if v is not None)
