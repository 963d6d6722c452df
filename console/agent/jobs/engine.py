"""Engine jobs: start a launch profile, stop an engine, restart one (a JobKind).

    vllm.start      preflight, spawn, load
    engine.stop     stop (drain, then SIGKILL after the grace)
    engine.restart  stop, preflight, spawn, load

A request the profile does not allow, or whose preflight fails, is refused (JobRefused,
422) before anything starts. The GPUs of an accepted start (or restart) are held for it
until the job ends (another start on them: 409): the preflight and the spawn are a model
load apart, and NVML shows an engine on its GPU only once it has loaded. The engine
itself runs in its own session (console.agent.supervise.supervisor) and outlives the agent; a
restarted agent re-adopts it and, if the start job was still waiting for it to load,
goes on waiting.

The cold start is measured from the spawn to ready (`/health` answers 200 and
`/v1/models` lists the served name), and split into phases from the engine's log lines
as they appear (which lines, its plugin says: `ready_phases`). A phase whose line never
appears stays null: not every build logs each.

The grace between SIGTERM and SIGKILL is the profile's `stop_grace_s` for an engine
this agent launched, else `[agent] stop_grace_s` (an engine found among the processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from console.agent.jobs import preflight
from console.agent.jobs.kinds import Active, JobContext, JobHost, JobRefused, StepFailed, ready
from console.agent.jobs.launch import Launch, LaunchError, engine_launch, ready_phases
from console.agent.jobs.store import JobRecord
from console.agent.snapshot.discovery import EngineProcess, alive
from console.agent.snapshot.engines import engine_id as make_engine_id
from console.agent.supervise import processes
from console.agent.supervise.supervisor import Managed
from console.core.config.load import Profile
from console.core.fetch import new_session
from console.core.wire import (
    COLD_START_PHASES,
    ColdStart,
    EngineJobResult,
    EngineRestart,
    EngineStop,
    Job,
    JobStep,
    VllmStart,
)
from plugins.base import Discovered, EngineTarget, local_url

log = logging.getLogger(__name__)

READY_POLL_S = 0.1
PORT_RELEASE_S = 10.0  # a restart waits this long for its stopped engine's port to be free
SETTLE_CYCLES = 3  # snapshot cycles a ready engine may take to show as ready in the snapshot


class EngineJobs:
    kinds: tuple[str, ...] = ("vllm.start", "engine.stop", "engine.restart")

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self.agent = host.agent
        self.supervisor = host.supervisor
        self.gone: dict[str, dict[str, Any]] = {}  # engines that exited while no agent ran

    # -- startup --------------------------------------------------------------------

    def adopt(self) -> None:
        """Track the engines a previous agent started and that still run."""
        running, gone = self.supervisor.adopt()
        for adopted in running:
            self._track(adopted)
            log.warning("re-adopted %s (pid %s)", adopted.engine_id, adopted.pgid)
        self.gone = dict(gone)

    def resume(self, record: JobRecord) -> bool:
        """A start the last agent left loading goes on waiting for its engine."""
        managed = next((m for m in self.supervisor.engines.values() if m.job_id == record.id), None)
        if managed is None or record.kind not in ("vllm.start", "engine.restart"):
            return False
        stored = record.result or {}
        steps = [JobStep.model_validate(s) for s in stored.get("steps", [])]
        active = Active(
            record,
            steps,
            stored.get("result", {}),
            engine_id=managed.engine_id,
            gpus=tuple(managed.gpus),
        )
        profile = self.agent.fleet.profiles.get(managed.profile)
        timeout = profile.ready_timeout_s if profile else 900.0
        active.result["note"] = "the agent restarted during the load and re-adopted the engine"
        self.host.run(active, lambda ctx: self._load(ctx, managed, timeout, self.grace(managed)))
        return True

    def interrupted(self, record: JobRecord) -> list[str]:
        engine = record.params.get("engine") or (record.result or {}).get("result", {}).get(
            "engine_id"
        )
        if isinstance(engine, str) and engine in self.gone:
            code = self.gone[engine].get("exit_code")
            return [f"engine {engine} is gone (exit code {code if code is not None else '?'})"]
        return []

    # -- reading ----------------------------------------------------------------------

    def log_path(self, job: Job) -> Path | None:
        engine = job.result.get("engine_id") or job.params.get("engine")
        return self.supervisor.root / engine / "engine.log" if isinstance(engine, str) else None

    def grace(self, managed: Managed) -> float:
        """SIGTERM to SIGKILL: the engine's profile's, else the agent's."""
        profile = self.agent.fleet.profiles.get(managed.profile)
        return profile.stop_grace_s if profile is not None else self.agent.fleet.agent.stop_grace_s

    # -- submitting -------------------------------------------------------------------

    async def plan(self, request: VllmStart) -> dict[str, Any]:
        """What a vllm.start would run and whether its preflight passes; starts nothing."""
        name, profile, launch, endpoint, engine = self._launch(request.profile, request.overrides)
        checks = await self._preflight(launch, profile, engine)
        return {
            "profile": name,
            "engine_id": engine,
            "endpoint": endpoint,
            "argv": list(launch.argv),
            "env": launch.env,
            "checks": [c.to_json() for c in checks],
            "ok": all(c.ok for c in checks),
        }

    async def submit(self, request: VllmStart | EngineStop | EngineRestart, who: str) -> Active:
        if isinstance(request, VllmStart):
            return await self._submit_start(request, who)
        return await self._submit_stop(
            request.engine, who, restart=request.kind == "engine.restart"
        )

    def _launch(
        self, name: str, overrides: dict[str, Any] | None
    ) -> tuple[str, Profile, Launch, str, str]:
        node = self.agent.node
        if name not in self.agent.fleet.profiles:
            known = ", ".join(n for n, p in self.agent.fleet.profiles.items() if p.node == node)
            raise JobRefused(
                404, f"profile: no profile {name!r} for node {node} ({known or 'none'})"
            )
        profile = self.agent.fleet.profiles[name]
        if profile.node != node:
            raise JobRefused(404, f"profile: {name} is for node {profile.node}, this is {node}")
        try:
            launch = engine_launch(profile, overrides or {})
        except LaunchError as exc:
            raise JobRefused(422, str(exc)) from None
        host = launch.args.get("host")
        endpoint = local_url(host if isinstance(host, str) else None, launch.port)
        return name, profile, launch, endpoint, make_engine_id(profile.engine, endpoint)

    async def _preflight(
        self, launch: Launch, profile: Profile, engine: str, job: str | None = None
    ) -> list[preflight.Check]:
        """The start's checks; `job`: the job that runs them (a restart), whose own hold on
        the GPUs is not another's."""
        gpus, gpu_status = await self.agent.fresh_gpus()
        running = None
        busy = self._busy(engine)
        if busy is not None:
            running = f"{engine} has a job running ({busy})"
        elif (managed := self.supervisor.engines.get(engine)) is not None and managed.alive():
            running = f"{engine} is already running (started by job {managed.job_id})"
        held = self._holders(launch.gpus, job)  # the GPUs' one verdict: the gpus check
        return await asyncio.to_thread(
            preflight.run, launch, profile, gpus, gpu_status, running, held
        )

    def _busy(self, engine: str) -> str | None:
        for job_id, active in self.host.active.items():
            if active.engine_id == engine:
                return job_id
        return None

    def _held(self, gpus: tuple[int, ...], but: str | None = None) -> str | None:
        """Which open job or running engine (other than engine `but`) holds one of `gpus`."""
        for job_id, active in self.host.active.items():
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

    def _holders(self, gpus: tuple[int, ...], but: str | None = None) -> dict[int, str]:
        """Each of `gpus` an open job (other than job `but`) or a running engine holds: by
        whom, in words."""
        out: dict[int, str] = {}
        for job_id, active in self.host.active.items():
            if job_id == but:
                continue
            for index in set(gpus) & set(active.gpus):
                out.setdefault(
                    index, f"job {job_id} ({active.record.kind} of {active.engine_id}, "
                    f"{active.state})",
                )  # fmt: skip
        for engine, managed in self.supervisor.engines.items():
            if managed.alive():
                for index in set(gpus) & set(managed.gpus):
                    out.setdefault(index, f"engine {engine} (started by job {managed.job_id})")
        return out

    async def _submit_start(self, request: VllmStart, who: str) -> Active:
        name, profile, launch, endpoint, engine = self._launch(request.profile, request.overrides)
        if (held := self._held(launch.gpus)) is not None:
            raise JobRefused(409, f"gpus: {held}")
        checks = await self._preflight(launch, profile, engine)
        if not all(c.ok for c in checks):
            raise JobRefused(
                409,  # the node's state (a port, a GPU, a path), not the request
                f"preflight failed: {preflight.failures(checks)}",
                checks=[c.to_json() for c in checks],
            )
        params = {"profile": name, "overrides": request.overrides or {}}
        record = self.host.store.create_job("vllm.start", who, params)
        now = time.time()
        result = EngineJobResult(engine_id=engine, endpoint=endpoint, argv=list(launch.argv))
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
            result=result.model_dump(exclude_none=True),
            engine_id=engine,
            gpus=launch.gpus,  # held until the job ends (_held)
        )
        self.host.run(active, lambda ctx: self._start_engine(ctx, name, profile, launch, endpoint))
        return active

    async def _submit_stop(self, engine: str, who: str, *, restart: bool) -> Active:
        kind = "engine.restart" if restart else "engine.stop"
        entry = self.agent.engines.tracked.get(engine)
        managed = self.supervisor.engines.get(engine)
        if entry is None and managed is None:
            raise JobRefused(404, f"engine: no engine {engine!r} on {self.agent.node}")
        if (busy := self._busy(engine)) is not None:
            raise JobRefused(409, f"engine: {engine} has a job running ({busy})")
        if managed is None and (entry is None or entry.process is None):
            raise JobRefused(
                409, f"engine: {engine} has no process on this node that the agent knows"
            )
        if managed is None and entry is not None and entry.process is not None:
            proc = entry.process
            if not alive(proc.pid, proc.create_time):
                raise JobRefused(
                    409, f"engine: {engine}'s process {proc.pid} has exited; nothing to stop"
                )
        if restart and managed is None:
            raise JobRefused(
                409,
                f"engine: {engine} was not started by this agent, so there is no launch "
                "profile to restart it with; stop it, then start a profile",
            )
        gpus: tuple[int, ...] = ()
        if restart and managed is not None:
            # The engine's GPUs stay held from its stop to its new start.
            gpus = tuple(managed.gpus)
            with contextlib.suppress(JobRefused):
                gpus = self._launch(managed.profile, managed.overrides)[2].gpus
            if (held := self._held(gpus, but=engine)) is not None:
                raise JobRefused(409, f"gpus: {held}")
        record = self.host.store.create_job(kind, who, {"engine": engine})
        steps = [JobStep(name="stop")]
        if restart:
            steps += [JobStep(name="preflight"), JobStep(name="spawn"), JobStep(name="load")]
        result = EngineJobResult(engine_id=engine).model_dump(exclude_none=True)
        active = Active(record, steps, result=result, engine_id=engine, gpus=gpus)
        self.host.run(active, lambda ctx: self._stop_engine(ctx, engine, managed, restart=restart))
        return active

    # -- running ----------------------------------------------------------------------

    async def cancelled(self, ctx: JobContext) -> None:
        """A cancelled start leaves no engine behind."""
        engine = ctx.active.engine_id
        if ctx.record.kind not in ("vllm.start", "engine.restart") or not engine:
            return
        managed = self.supervisor.engines.get(engine)
        if managed is not None and ctx.step("load").state in ("running", "pending"):
            with contextlib.suppress(Exception):
                ctx.result["stopped"] = await self.supervisor.stop(managed, self.grace(managed))
                self.supervisor.forget(managed.engine_id)
                await self.agent.engines.release(managed.engine_id)

    async def _start_engine(
        self, ctx: JobContext, name: str, profile: Profile, launch: Launch, endpoint: str
    ) -> None:
        engine = ctx.active.engine_id
        assert engine is not None
        step = ctx.begin("spawn")
        spawning = asyncio.ensure_future(
            asyncio.to_thread(
                self.supervisor.spawn,
                engine,
                profile.engine,
                name,
                dict(ctx.record.params.get("overrides") or {}),
                launch,
                endpoint,
                profile.served_model_name,
                ctx.id,
            )
        )
        try:
            managed = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            # A cancel cannot stop the thread: let it finish, so the engine it starts is
            # one the cancel (self.cancelled) finds and stops, not one left running.
            with contextlib.suppress(Exception):
                self.supervisor.track(await spawning)
            raise
        except OSError as exc:
            step.detail = str(exc)
            raise StepFailed(f"spawn: {exc}") from None
        self.supervisor.track(managed)  # here, on the loop: the thread touched no shared dict
        self._track(managed)
        ctx.end(step, f"session leader pid {managed.pgid}; log {managed.log_path}")
        await self._load(ctx, managed, profile.ready_timeout_s, profile.stop_grace_s)

    async def _load(
        self, ctx: JobContext, managed: Managed, timeout_s: float, grace_s: float
    ) -> None:
        step = ctx.begin("load")
        t0 = managed.started  # wall clock of the spawn, so a re-adopting agent agrees
        cold = ColdStart(phases=dict.fromkeys(COLD_START_PHASES))
        if isinstance(ctx.result.get("cold_start"), dict):
            cold.phases.update(ctx.result["cold_start"].get("phases", {}))
        phases = cold.phases
        ctx.result["cold_start"] = cold.model_dump()
        offset = managed.log_offset
        markers = ready_phases(managed.kind)  # the engine plugin's log lines, first match wins
        async with new_session(limit=2) as http:
            while True:
                offset, lines = await asyncio.to_thread(
                    processes.new_lines, managed.log_path, offset
                )
                seen = time.time() - t0
                changed = False
                for line in lines:
                    for phase, marks in markers:
                        if phases.get(phase, 0) is None and any(m in line for m in marks):
                            phases[phase] = round(seen, 3)
                            changed = True
                if changed:
                    step.detail = _phase_text(phases)
                    ctx.result["cold_start"] = cold.model_dump()
                    ctx.save()
                if not managed.alive():
                    code = managed.exit_code()
                    tail = processes.tail(managed.log_path)
                    self.supervisor.forget(managed.engine_id)
                    raise StepFailed(
                        f"load: the engine exited with code "
                        f"{code if code is not None else 'unknown'} before it was ready",
                        log_tail=tail,
                        exit_code=code,
                    )
                if await ready(http, managed.endpoint, managed.served_model_name):
                    cold.total_s = phases["ready"] = round(time.time() - t0, 3)
                    ctx.result["cold_start"] = cold.model_dump()
                    shown = await self._settle(managed.engine_id)
                    ctx.result["snapshot_state"] = shown
                    ctx.end(
                        step,
                        f"ready in {cold.total_s:.1f} s; "
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
                        log_tail=processes.tail(managed.log_path),
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

    async def _stop_engine(
        self, ctx: JobContext, engine: str, managed: Managed | None, *, restart: bool
    ) -> None:
        step = ctx.begin("stop")
        if managed is not None:
            how = await self.supervisor.stop(managed, self.grace(managed))
            self.supervisor.forget(engine)
        else:
            how = await self._stop_unmanaged(engine)
        await self.agent.engines.release(engine)
        ctx.end(step, how)
        if not restart:
            return
        assert managed is not None
        step = ctx.begin("preflight")
        try:
            name, profile, launch, endpoint, _ = self._launch(managed.profile, managed.overrides)
        except JobRefused as exc:
            raise StepFailed(f"preflight: {exc}") from None
        checks = await self._preflight(launch, profile, "", ctx.id)
        # The engine just stopped: its listening socket can outlive its processes for a
        # moment (CI saw "port: N is in use (by a process this agent may not inspect)"
        # right after a SIGKILLed group). The port alone failing is waited on, a while.
        until = time.monotonic() + PORT_RELEASE_S
        while preflight.only_port(checks) and time.monotonic() < until:
            await asyncio.sleep(0.2)
            checks = await self._preflight(launch, profile, "", ctx.id)
        detail = "; ".join(f"{c.name}: {c.detail}" for c in checks)
        if not all(c.ok for c in checks):
            step.detail = detail
            raise StepFailed(f"preflight failed: {preflight.failures(checks)}")
        ctx.end(step, detail)
        ctx.result.update(argv=list(launch.argv), endpoint=endpoint)
        await self._start_engine(ctx, name, profile, launch, endpoint)

    async def _stop_unmanaged(self, engine: str) -> str:
        """An engine this agent did not start (found among the processes), by its pid and
        the start time it was found with, after the agent's grace."""
        proc = self.agent.engines.tracked[engine].process
        assert proc is not None
        grace = self.agent.fleet.agent.stop_grace_s
        return await processes.terminate_process(proc.pid, proc.create_time, grace)

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


def _phase_text(phases: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {v:.1f} s" for k, v in phases.items() if v is not None)
