"""TensorRT-LLM rebuild drills (job kind `drill.run`) and "rebuild required" detection.

A drill runs six steps, each recorded with its duration and, for a process, its exit code:

    preflight  versions of driver, CUDA, TensorRT, TensorRT-LLM and the GPU (NVML plus the
               drill's probe), checked against the drill's pins; the weights hash and the
               build key; a key already in the engine cache skips convert and build
    convert    convert_checkpoint.py or quantize.py (argv template)
    build      trtllm-build into CACHE/.staging/JOB/engine, then the manifest beside it;
               for the PyTorch pipeline, trtllm-serve's cold start and warm-up
    validate   the candidate, started for the drill, against the baseline (vLLM by
               default): greedy answers to the drill's prompts; agreement vs thresholds
    benchmark  the candidate's cold start against vLLM's recorded one, and a concurrency
               sweep (TTFT and ITL p95, throughput) of both
    promote    rename the staged engine into the cache under its build key, and re-point
               the deployment's engine_dir link

Each process step runs under the log capper (console.agent.logcap) in a session of its
own, writing to the drill's log, which the job's log route streams. A timeout or a cancel
stops the step's whole process group (SIGTERM, then SIGKILL after a grace). A failure stops
the drill with the failing step's last lines. Whatever way a drill ends, its candidate
server is stopped and an unpromoted staging directory is removed: nothing half-built
stays. A killed agent leaves the step's pid in the job record, and the next agent kills
that group when it marks the job failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import psutil

from console.agent import drill_checks, manifest
from console.agent.auth import child_env
from console.agent.drill_plan import PlannedStep, plan, values
from console.agent.jobtypes import Active, JobRefused, StepFailed, ready
from console.agent.preflight import port_check
from console.agent.signals import group_alive, signal_group
from console.agent.supervisor import log_tail
from console.core.config import Deployment, Drill, Model
from console.core.wire import JobStep, TrtEngine

if TYPE_CHECKING:
    from console.agent.jobs import JobRunner

log = logging.getLogger(__name__)

STEPS = ("preflight", "convert", "build", "validate", "benchmark", "promote")
KILL_GRACE_S = 5.0
LOG_TAIL_LINES = 30
PROBE_TIMEOUT_S = 120.0
PROBE_MAX_BYTES = 1 << 20  # a version probe prints one JSON line
REAP_S = 10.0  # after a kill, for the pipes to close
PROBE_EVERY_S = 600.0  # the staleness check re-runs a drill's version probe this often
REFRESH_S = 10.0  # and compares manifests with the node this often
WARMUP_REQUESTS = 4


@dataclass
class Run:
    """One drill job: what it rebuilds, its files, and the processes it has running."""

    job_id: str
    name: str
    drill: Drill
    model: Model
    deployment: Deployment
    served: str  # what the candidate serves the model as
    env: dict[str, str]  # every step's environment
    dir: Path  # STATE/drills/JOB: drill.log, step status files
    staging: Path  # CACHE/.staging/JOB
    steps: dict[str, PlannedStep] = field(default_factory=dict)  # filled templates
    processes: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> pgid

    @property
    def log(self) -> Path:
        return self.dir / "drill.log"


class DrillRunner:
    def __init__(self, jobs: JobRunner, root: Path) -> None:
        self.jobs = jobs
        self.agent = jobs.agent
        self.root = root / "drills"
        self.root.mkdir(parents=True, exist_ok=True)
        self.hasher = manifest.WeightsHasher(root / "weights-hashes.json")
        self.probed: dict[str, tuple[float, dict[str, Any]]] = {}  # drill -> (when, output)
        self.engines: list[TrtEngine] = []
        self._task: asyncio.Task[None] | None = None

    # -- what this node has ---------------------------------------------------------

    def drills(self) -> dict[str, Drill]:
        """The fleet's drills whose deployment is on this node."""
        out = {}
        for name, drill in self.agent.fleet.drills.items():
            found = self.agent.fleet.deployment(drill.deployment)
            if found is not None and found[1].node == self.agent.node:
                out[name] = drill
        return out

    def trt_deployments(self) -> list[tuple[Model, Deployment]]:
        targets = {d.deployment for d in self.drills().values()}
        return [
            (m, d)
            for m, d in self.agent.fleet.deployments_on(self.agent.node)
            if d.engine == "trtllm" or d.engine_dir is not None or d.id in targets
        ]

    def drill_for(self, deployment: str) -> tuple[str, Drill] | None:
        return next(((n, d) for n, d in self.drills().items() if d.deployment == deployment), None)

    def log_path(self, job_id: str) -> Path:
        return self.root / job_id / "drill.log"

    # -- submitting -----------------------------------------------------------------

    async def submit(self, body: dict[str, Any], who: str) -> Active:

        name = body.get("drill")
        mine = self.drills()
        if not isinstance(name, str) or name not in mine:
            if isinstance(name, str) and name in self.agent.fleet.drills:
                raise JobRefused(422, f"drill: {name} rebuilds a deployment on another node")
            raise JobRefused(
                422,
                f"drill: no drill {name!r} on node {self.agent.node} ({', '.join(mine) or 'none'})",
            )
        drill = mine[name]
        for job_id, active in self.jobs.active.items():
            if active.record.kind != "drill.run":
                continue
            if active.record.params.get("drill") == name:
                raise JobRefused(409, f"drill: {name} is already running (job {job_id})")
            if active.result.get("deployment") == drill.deployment:
                raise JobRefused(
                    409,
                    f"drill: job {job_id} ({active.record.params.get('drill')}) is rebuilding "
                    f"{drill.deployment} already",
                )
        record = self.jobs.store.create_job("drill.run", who, {"drill": name})
        active = Active(
            record,
            [JobStep(name=s) for s in STEPS],
            result={"drill": name, "deployment": drill.deployment, "model": drill.model},
        )
        self.jobs._run(active, self._run(active, name, drill))
        return active

    # -- running --------------------------------------------------------------------

    async def _run(self, active: Active, name: str, drill: Drill) -> None:
        job_id = active.record.id
        cache = manifest.EngineCache.open(Path(drill.engine_cache).expanduser())
        model, deployment = self.agent.fleet.deployment(drill.deployment)  # type: ignore[misc]
        run = Run(
            job_id,
            name,
            drill,
            model,
            deployment,
            # A trtllm-serve deployment's own name, else the model's (Triton's engine_model
            # names its ensemble, not the model).
            (deployment.engine_model if deployment.engine == "trtllm" else None) or model.name,
            child_env(self.agent.fleet, {"PYTHONUNBUFFERED": "1"}, drill.env),
            self.root / job_id,
            cache.staging(job_id),
        )
        run.dir.mkdir(parents=True, exist_ok=True)
        engine_stage = run.staging / "engine"
        ckpt = engine_stage if drill.pipeline == "pytorch" else run.staging / "checkpoint"
        found = values(drill, run.served, engine_stage, ckpt, engine_stage)
        run.steps = plan(drill, found)
        result = active.result
        result["gates"] = []
        result["step_runs"] = {}
        result["staging_dir"] = str(run.staging)
        promoted = False
        try:
            key, hit = await self._preflight(active, run, cache)
            engine_dir = cache.path(key) if hit else engine_stage
            if drill.pipeline == "pytorch" and not hit and run.steps["convert"].skip:
                engine_dir = Path(found["checkpoint"])
            found["engine_dir"] = str(engine_dir)
            run.steps = plan(drill, found)
            if hit:
                why = f"cache hit: serve from cache {cache.path(key)}"
                for step in ("convert", "build"):
                    self._skip(active, step, why)
            else:
                await self._convert(active, run)
                engine_stage.mkdir(parents=True, exist_ok=True)
                await self._build(active, run)
                self._manifest(active, run, engine_stage, key)
            await self._validate(active, run)
            await self._benchmark(active, run)
            await self._stop_candidate(active, run)
            promoted = await self._promote(active, run, cache, key, hit)
            result["time_to_rebuild_s"] = round(time.time() - active.record.created, 3)
        finally:
            await self._cleanup(active, run, promoted)
            self.probed.pop(name, None)
            with contextlib.suppress(Exception):
                await self.refresh()

    def _step(self, active: Active, name: str) -> JobStep:
        return self.jobs._begin(active, name)

    def _skip(self, active: Active, name: str, why: str) -> None:
        step = active.step(name)
        step.state, step.detail = "skipped", why
        step.started = step.ended = time.time()
        self.jobs._save(active)

    def _gate(self, active: Active, name: str, ok: bool, detail: str) -> None:
        active.result["gates"].append({"gate": name, "ok": ok, "detail": detail})
        self.jobs._save(active)

    async def _preflight(
        self, active: Active, run: Run, cache: manifest.EngineCache
    ) -> tuple[str, bool]:
        drill = run.drill
        step = self._step(active, "preflight")
        output = await self._run_step(active, run, run.steps["preflight"])
        probed = last_json(output)
        if probed is None:
            raise StepFailed(
                "preflight: the version probe printed no JSON line",
                log_tail=log_tail(run.log, LOG_TAIL_LINES),
            )
        if not probed.get("tensorrt_llm"):
            why = probed.get("error_tensorrt_llm") or "it printed no tensorrt_llm version"
            raise StepFailed(f"preflight: TensorRT-LLM is not importable on this node: {why}")
        self.probed[active.result["drill"]] = (time.time(), probed)
        facts, sources = await self._facts(probed)
        active.result["versions"] = facts
        active.result["version_sources"] = sources
        pins = drill.pins.model_dump()
        mismatches = [
            f"{manifest.FACT_NAMES[k]} pinned {want}, node has {facts.get(k) or 'unknown'}"
            for k, want in pins.items()
            if want is not None and str(facts.get(k)) != str(want)
        ]
        pinned = [manifest.FACT_NAMES[k] for k, want in pins.items() if want is not None]
        matched = f"{', '.join(pinned)} match the pins" if pinned else "no pins declared"
        self._gate(active, "pins", not mismatches, "; ".join(mismatches) or matched)
        if mismatches:
            raise StepFailed("preflight: " + "; ".join(mismatches))
        problems = []
        port = port_check(drill.serve_port)
        if not port.ok:
            problems.append(f"serve_port: {port.detail}")
        checkpoint = Path(drill.checkpoint).expanduser()
        try:
            weights = await asyncio.to_thread(self.hasher.hash, checkpoint)
        except (OSError, FileNotFoundError) as exc:
            problems.append(f"checkpoint: {exc}")
            weights = ""
        if problems:
            raise StepFailed("preflight: " + "; ".join(problems))
        inputs = manifest.key_inputs(
            drill.model,
            weights,
            drill.pipeline,
            drill.precision,
            drill.tp_size,
            drill.shapes.model_dump(),
            facts,
        )
        key = manifest.build_key(inputs)
        hit = False
        if drill.use_cache and key in cache.entries:
            bad = await asyncio.to_thread(
                manifest.verify_files, cache.path(key), cache.entries[key]
            )
            hit = not bad
            if bad:
                active.result["cache_problem"] = "; ".join(bad)
        active.result.update(
            build_key=key,
            key_inputs=inputs,
            weights_sha256=weights,
            cache="hit" if hit else "miss",
        )
        shown = ", ".join(f"{manifest.FACT_NAMES[k]} {facts.get(k) or '?'}" for k in manifest.FACTS)
        verdict = "cache hit: serve from cache" if hit else "cache miss: build"
        self.jobs._end(active, step, f"{shown}; key {key}; {verdict}")
        return key, hit

    async def _facts(self, probed: dict[str, Any]) -> tuple[dict[str, str | None], dict[str, str]]:
        """The node's facts: NVML where it answers, else what the probe printed."""
        gpus, status = await self.agent.fresh_gpus()
        gpu = gpus[0] if gpus else None
        nvml: dict[str, str | None] = {
            "driver": self.agent.gpu.driver_version if status == "ok" else None,
            "gpu": gpu.name if gpu else None,
            "compute_capability": gpu.compute_capability if gpu else None,
        }
        facts: dict[str, str | None] = {}
        sources: dict[str, str] = {}
        for key in manifest.FACTS:
            from_probe = probed.get(key)
            if key == "cuda":  # the runtime's CUDA first, else the driver's
                value = from_probe or (
                    self.agent.gpu.cuda_driver_version if status == "ok" else None
                )
                source = "probe" if from_probe else "nvml"
            elif nvml.get(key) is not None:
                value, source = nvml[key], "nvml"
            else:
                value, source = from_probe, "probe"
            facts[key] = None if value is None else str(value)
            if value is not None:
                sources[key] = source
        return facts, sources

    async def _convert(self, active: Active, run: Run) -> None:
        planned = run.steps["convert"]
        if planned.skip:
            self._skip(active, "convert", planned.skip)
            return
        step = self._step(active, "convert")
        await self._run_step(active, run, planned)
        self.jobs._end(active, step, self._timing_text(active, "convert"))

    async def _build(self, active: Active, run: Run) -> None:
        step = self._step(active, "build")
        planned = run.steps["build"]
        if planned.argv is not None:
            await self._run_step(active, run, planned)
            self.jobs._end(active, step, self._timing_text(active, "build"))
            return
        # The PyTorch pipeline: the "build" is the server's cold start and its warm-up.
        cold = await self._start_candidate(active, run)
        warm = await self._warm_up(run)
        self.jobs._end(active, step, f"cold start {cold:.1f} s; warm-up {warm:.1f} s")

    def _manifest(self, active: Active, run: Run, engine: Path, key: str) -> None:
        drill = run.drill
        facts = active.result["versions"]
        build = active.step("build")
        written = manifest.write_manifest(
            engine,
            {
                "schema": 1,
                "build_key": key,
                "drill": run.name,
                "job_id": active.record.id,
                "node": self.agent.node,
                "built": time.time(),
                "build_s": round((build.ended or time.time()) - (build.started or time.time()), 3),
                "model": {
                    "name": drill.model,
                    "checkpoint": str(Path(drill.checkpoint).expanduser()),
                    "weights_sha256": active.result["weights_sha256"],
                },
                "pipeline": drill.pipeline,
                "precision": drill.precision,
                "tp_size": drill.tp_size,
                "shapes": drill.shapes.model_dump(),
                "versions": {
                    k: facts.get(k) for k in ("tensorrt_llm", "tensorrt", "cuda", "driver")
                },
                "gpu": {
                    "name": facts.get("gpu"),
                    "compute_capability": facts.get("compute_capability"),
                },
                "engine_config": _engine_config(engine),
            },
        )
        active.result["manifest"] = {
            "path": str(engine / manifest.MANIFEST),
            "files": written["files"],
        }
        self.jobs._save(active)

    async def _validate(self, active: Active, run: Run) -> None:
        step = self._step(active, "validate")
        if "candidate" not in run.processes:
            await self._start_candidate(active, run)
        baseline = self._baseline(run)
        active.result["baseline"] = {"deployment": baseline[0].id, "endpoint": baseline[0].endpoint}
        spec = run.drill.validate_
        try:
            found = await drill_checks.validate(
                (candidate_url(run.drill), run.served),
                (baseline[0].endpoint, baseline[1]),
                spec.prompts,
                spec.max_tokens,
                spec.first_n,
                spec.timeout_s,
            )
        except (TimeoutError, drill_checks.CheckFailed, aiohttp.ClientError) as exc:
            raise StepFailed(f"validate: {str(exc) or type(exc).__name__}") from None
        active.result["validate"] = found
        exact, first = found["exact_match"] or 0.0, found["first_n_agreement"] or 0.0
        ok = exact >= spec.min_exact_match and first >= spec.min_first_n
        detail = (
            f"exact match {exact:.0%} (min {spec.min_exact_match:.0%}), first {spec.first_n} "
            f"{found['unit']} agree {first:.0%} (min {spec.min_first_n:.0%}) over "
            f"{found['prompts']} prompts"
        )
        self._gate(active, "validate", ok, detail)
        if not ok:
            step.detail = detail
            raise StepFailed(f"validate: agreement below the threshold: {detail}")
        self.jobs._end(active, step, detail)

    def _baseline(self, run: Run) -> tuple[Deployment, str]:
        """The deployment the candidate is compared with, and its name for the model."""
        model, wanted = run.model, run.drill.baseline
        if wanted is not None:
            dep = next(d for d in model.deployments if d.id == wanted)
        else:
            dep = next(d for d in model.deployments if d.engine == "vllm")
        return dep, dep.engine_model or model.name

    async def _benchmark(self, active: Active, run: Run) -> None:
        drill, model = run.drill, run.model
        step = self._step(active, "benchmark")
        spec = drill.benchmark
        baseline, baseline_model = self._baseline(run)
        levels: list[dict[str, Any]] = []
        bench: dict[str, Any] = {
            "cold_start_s": {
                "candidate": active.result.get("candidate_cold_start_s"),
                "baseline": self._baseline_cold_start(baseline, model),
            },
            "levels": levels,
        }
        active.result["benchmark"] = bench
        deadline = time.monotonic() + spec.timeout_s
        for level in spec.concurrency:
            n = drill_checks.requests_for(level, spec.requests_per_level)
            row: dict[str, Any] = {"concurrency": level, "requests": n}
            for who, url, name in (
                ("candidate", candidate_url(drill), run.served),
                ("baseline", baseline.endpoint, baseline_model),
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StepFailed(f"benchmark: not done within {spec.timeout_s:g} s")
                step.detail = f"concurrency {level}: {who}"
                self.jobs._save(active)
                row[who] = await drill_checks.sweep_level(
                    url, name, level, n, spec.max_tokens, spec.prompt, left
                )
            levels.append(row)
            self.jobs._save(active)
        gates = benchmark_gates(drill, bench)
        for gate, ok, detail in gates:
            self._gate(active, gate, ok, detail)
        failed = [d for _, ok, d in gates if not ok]
        detail = "; ".join([*(d for _, _, d in gates), *sweep_summary(bench)])
        if failed:
            step.detail = detail
            raise StepFailed("benchmark: " + "; ".join(failed))
        self.jobs._end(active, step, detail)

    def _baseline_cold_start(self, baseline: Deployment, model: Model) -> dict[str, Any] | None:
        """The newest vLLM start this agent recorded for the baseline (its profile, else
        any profile serving the model)."""
        profiles = self.agent.fleet.profiles
        wanted = (
            {baseline.profile}
            if baseline.profile
            else {
                n
                for n, p in profiles.items()
                if p.served_model_name in (model.name, baseline.engine_model)
            }
        )
        for record in self.jobs.store.jobs(500, ("vllm.start", "engine.restart")):
            if record.state != "succeeded":
                continue
            stored = (record.result or {}).get("result", {})
            profile = record.params.get("profile")
            if record.kind == "engine.restart":
                profile = stored.get("profile", profile)
            total = (stored.get("cold_start") or {}).get("total_s")
            if profile in wanted and isinstance(total, int | float):
                return {"total_s": total, "job_id": record.id, "profile": profile}
        return None

    async def _promote(
        self, active: Active, run: Run, cache: manifest.EngineCache, key: str, hit: bool
    ) -> bool:
        drill, deployment = run.drill, run.deployment
        step = self._step(active, "promote")
        if hit:
            target, how = cache.path(key), "already in the cache"
        else:
            target, new = await asyncio.to_thread(cache.promote, run.staging / "engine", key)
            how = "into the cache" if new else "the cache already had it (built twice)"
        link = "engine_dir is not set for the deployment; nothing re-pointed"
        if deployment.engine_dir and drill.link_engine_dir:
            link = await asyncio.to_thread(
                manifest.point_link, Path(deployment.engine_dir).expanduser(), target
            )
        elif deployment.engine_dir:
            link = "link_engine_dir = false: the deployment's engine_dir is unchanged"
        active.result["promoted"] = {"path": str(target), "link": link}
        self.jobs._end(active, step, f"{key} {how}; {link}")
        return True

    # -- processes ------------------------------------------------------------------

    async def _run_step(self, active: Active, run: Run, planned: PlannedStep) -> str:
        """Run one step's argv under the log capper; its output (since it started)."""
        assert planned.argv is not None
        name = planned.name
        offset = _log_header(run.log, f"step {name}: {shlex.join(planned.argv)}")
        status_path = run.dir / f"{name}.status.json"
        status_path.unlink(missing_ok=True)
        spawned = time.time()
        proc = await self._spawn(active, run, name, planned.argv, status_path)
        try:
            await asyncio.wait_for(proc.wait(), planned.timeout_s)
        except TimeoutError:
            how = await self._kill(active, run, name)
            raise StepFailed(
                f"{name}: no result within {planned.timeout_s:g} s; {how}",
                log_tail=tail_since(run.log, offset),
            ) from None
        except BaseException:  # cancelled: the step's whole group goes with the job
            await self._kill(active, run, name)
            raise
        recorded = time.time()
        run.processes.pop(name, None)
        status = _read_json(status_path)
        code = status.get("exit_code", proc.returncode)
        timing = {
            "argv": planned.argv,
            "exit_code": code,
            "duration_s": round(recorded - spawned, 3),
            "spawn_to_first_output_s": _delta(spawned, status.get("first_output")),
            "exit_to_recorded_s": _delta(status.get("ended"), recorded),
        }
        active.result["step_runs"][name] = timing
        self.jobs._save(active)
        output = _read_from(run.log, offset)
        if code != 0:
            raise StepFailed(
                f"{name}: exited with code {code}", log_tail=tail_since(run.log, offset)
            )
        missing = [str(p) for p in planned.expect_files if not p.exists()]
        if missing:
            raise StepFailed(
                f"{name}: exited 0 but did not write {', '.join(missing)}",
                log_tail=tail_since(run.log, offset),
            )
        if planned.expect_output and not re.search(planned.expect_output, output):
            raise StepFailed(
                f"{name}: its output never matched {planned.expect_output!r}",
                log_tail=tail_since(run.log, offset),
            )
        return output

    async def _spawn(
        self, active: Active, run: Run, name: str, argv: list[str], status: Path
    ) -> asyncio.subprocess.Process:
        settings = self.agent.fleet.agent
        capper = [
            sys.executable,
            "-m",
            "console.agent.logcap",
            "--max-bytes",
            str(settings.engine_log_max_bytes),
            "--keep",
            str(settings.engine_log_keep),
            "--log",
            str(run.log),
            "--status",
            str(status),
            "--",
            *argv,
        ]
        proc = await asyncio.create_subprocess_exec(
            *capper,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=run.dir,
            env=run.env,
            start_new_session=True,
        )
        run.processes[name] = (proc.pid, _created(proc.pid))
        active.result["processes"] = {k: list(v) for k, v in run.processes.items()}
        self.jobs._save(active)  # a later agent kills what a killed one left running
        return proc

    async def _kill(self, active: Active, run: Run, name: str) -> str:
        pgid, created = run.processes.pop(name, (None, 0.0))
        active.result["processes"] = {k: list(v) for k, v in run.processes.items()}
        if pgid is None:
            return "not running"
        return await kill_group(pgid, created, KILL_GRACE_S)

    async def _start_candidate(self, active: Active, run: Run) -> float:
        """Start the candidate server; its cold start (spawn to ready) in seconds."""
        serve = run.steps["serve"]
        assert serve.argv is not None
        offset = _log_header(run.log, f"candidate: {shlex.join(serve.argv)}")
        status = run.dir / "candidate.status.json"
        status.unlink(missing_ok=True)
        started = time.time()
        proc = await self._spawn(active, run, "candidate", serve.argv, status)
        url = candidate_url(run.drill)
        async with aiohttp.ClientSession() as http:
            while True:
                if proc.returncode is not None:
                    run.processes.pop("candidate", None)
                    code = _read_json(status).get("exit_code", proc.returncode)
                    raise StepFailed(
                        f"candidate: trtllm-serve exited with code {code} before it was ready",
                        log_tail=tail_since(run.log, offset),
                    )
                if await ready(http, url, run.served):
                    break
                if time.time() - started > serve.timeout_s:
                    how = await self._kill(active, run, "candidate")
                    raise StepFailed(
                        f"candidate: not ready within {serve.timeout_s:g} s; {how}",
                        log_tail=tail_since(run.log, offset),
                    )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), 0.1)
        cold = round(time.time() - started, 3)
        active.result["candidate_cold_start_s"] = cold
        self.jobs._save(active)
        return cold

    async def _warm_up(self, run: Run) -> float:
        started = time.monotonic()
        with contextlib.suppress(drill_checks.CheckFailed, aiohttp.ClientError):
            await drill_checks.sweep_level(
                candidate_url(run.drill), run.served, 1, WARMUP_REQUESTS, 8, "warm up", 300
            )
        return time.monotonic() - started

    async def _stop_candidate(self, active: Active, run: Run) -> None:
        if "candidate" in run.processes:
            active.result["candidate_stop"] = await self._kill(active, run, "candidate")
            self.jobs._save(active)

    async def _cleanup(self, active: Active, run: Run, promoted: bool) -> None:
        for name in list(run.processes):
            active.result.setdefault("killed", {})[name] = await self._kill(active, run, name)
        if run.staging.exists():
            await asyncio.to_thread(shutil.rmtree, run.staging, True)
            if not promoted:
                active.result["staging"] = f"removed {run.staging}"
        with contextlib.suppress(OSError):
            run.staging.parent.rmdir()  # .staging, when no other drill uses it

    def cleanup_interrupted(self, result: dict[str, Any]) -> list[str]:
        """A job a killed agent left open: kill its step and candidate groups."""
        done = []
        for name, (pgid, created) in (result.get("processes") or {}).items():
            if signal_group(pgid, created, signal.SIGKILL):  # only if it is still that group
                done.append(f"{name} (process group {pgid}) killed")
        staging = result.get("staging_dir")
        if isinstance(staging, str):
            shutil.rmtree(staging, ignore_errors=True)
        return done

    def _timing_text(self, active: Active, name: str) -> str:
        t = active.result["step_runs"].get(name, {})
        return f"exit {t.get('exit_code')} after {t.get('duration_s', 0):.1f} s"

    # -- staleness ------------------------------------------------------------------

    def start(self) -> None:
        if self.trt_deployments():
            self._task = asyncio.create_task(self._refresh_loop(), name="trt-staleness")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("staleness check failed")
            await asyncio.sleep(REFRESH_S)

    async def _probe(self, name: str, drill: Drill) -> dict[str, Any] | None:
        """The drill's version probe, cached for PROBE_EVERY_S."""
        known = self.probed.get(name)
        if known is not None and time.time() - known[0] < PROBE_EVERY_S:
            return known[1]
        found = values(drill, "", Path("/nonexistent"), Path("/nonexistent"), "")
        argv = plan(drill, found)["preflight"].argv
        if argv is None:
            return None
        env = child_env(self.agent.fleet, drill.env)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError:
            return None
        out = await capped_output(proc, PROBE_MAX_BYTES, PROBE_TIMEOUT_S)
        if out is None:
            log.warning(
                "drill %s: the version probe ran over %g s or wrote over %d bytes; killed",
                name,
                PROBE_TIMEOUT_S,
                PROBE_MAX_BYTES,
            )
            return None
        probed = last_json(out.decode(errors="replace"))
        if probed is not None:
            self.probed[name] = (time.time(), probed)
        return probed

    async def current_facts(self, deployment: str) -> tuple[dict[str, str | None], str | None]:
        """What the node is now, for a deployment's engine; and why a part is unknown."""
        found = self.drill_for(deployment)
        probed: dict[str, Any] = {}
        note = None
        if found is not None:
            probed = await self._probe(*found) or {}
            if not probed:
                note = f"drill {found[0]}'s version probe gave no answer"
        else:
            note = "no drill for this deployment declares a version probe"
        facts, _ = await self._facts(probed)
        return facts, note

    async def check(self, model: Model, dep: Deployment) -> TrtEngine:
        entry = TrtEngine(
            deployment=dep.id, model=model.name, engine_dir=dep.engine_dir, state="unknown"
        )
        entry.last_drill = self._last_drill(dep.id)
        if dep.engine_dir is None:
            entry.reasons = ["unknown provenance: the deployment has no engine_dir in fleet.toml"]
            return entry
        engine_dir = Path(dep.engine_dir).expanduser()
        found = await asyncio.to_thread(manifest.read_manifest, engine_dir)
        if found is None:
            entry.reasons = [f"unknown provenance: no engineroom manifest in {engine_dir}"]
            return entry
        facts, note = await self.current_facts(dep.id)
        checkpoint = Path(found.get("model", {}).get("checkpoint", ""))
        try:
            facts["weights_sha256"] = await asyncio.to_thread(self.hasher.hash, checkpoint)
        except OSError as exc:
            facts["weights_sha256"] = None
            note = f"{note}; " if note else ""
            note += f"weights not checked: {exc}"
        entry.build_key = found.get("build_key")
        entry.built = found.get("built")
        gpu = found.get("gpu", {})
        entry.built_with = {
            **found.get("versions", {}),
            "gpu": gpu.get("name"),
            "compute_capability": gpu.get("compute_capability"),
        }
        entry.reasons = manifest.stale_reasons(found, facts)
        entry.unchecked = manifest.unknown_facts(facts)
        entry.note = note
        if entry.reasons:
            entry.state = "stale"
        elif entry.unchecked:  # nothing wrong found, but not all of it could be looked at
            entry.state = "unknown"
            entry.reasons = [
                f"could not check {', '.join(entry.unchecked)}" + (f" ({note})" if note else "")
            ]
        else:
            entry.state = "current"
        return entry

    async def refresh(self) -> list[TrtEngine]:
        self.engines = [await self.check(m, d) for m, d in self.trt_deployments()]
        return self.engines

    def view(self) -> list[TrtEngine]:
        return list(self.engines)

    def _last_drill(self, deployment: str) -> dict[str, Any] | None:
        for record in self.jobs.store.jobs(500, ("drill.run",)):
            if record.state not in ("succeeded", "failed"):
                continue
            stored = (record.result or {}).get("result", {})
            if stored.get("deployment") != deployment:
                continue
            return {
                "job_id": record.id,
                "state": record.state,
                "ended": record.updated,
                "total_s": round(record.updated - record.created, 1),
                "time_to_rebuild_s": stored.get("time_to_rebuild_s"),
            }
        return None

    def _last_success(self, deployment: str) -> float | None:
        for record in self.jobs.store.jobs(500, ("drill.run",)):
            stored = (record.result or {}).get("result", {})
            if (
                record.state == "succeeded"
                and stored.get("deployment") == deployment
                and isinstance(stored.get("time_to_rebuild_s"), int | float)
            ):
                return float(stored["time_to_rebuild_s"])
        return None

    async def what_if(self, change: dict[str, Any]) -> list[dict[str, Any]]:
        """Each TensorRT-LLM deployment against a hypothetical node (driver, cuda,
        tensorrt, tensorrt_llm, gpu, compute_capability): still serves, serves from the
        cache, or needs a rebuild, with the time its last drill took; "unknown" where a
        fact the change leaves alone could not be read."""
        unknown = sorted(set(change) - set(manifest.FACTS))
        if unknown:
            raise ValueError(f"unknown keys {unknown} (known: {', '.join(manifest.FACTS)})")
        change = {k: str(v) for k, v in change.items() if v is not None}
        if "gpu" in change and "compute_capability" not in change:
            cc = manifest.compute_capability_of(change["gpu"])
            change["compute_capability"] = cc or f"unknown for {change['gpu']}"
        out = []
        for model, dep in self.trt_deployments():
            row: dict[str, Any] = {
                "node": self.agent.node,
                "deployment": dep.id,
                "model": model.name,
            }
            found = (
                manifest.read_manifest(Path(dep.engine_dir).expanduser())
                if dep.engine_dir
                else None
            )
            estimate = self._last_success(dep.id)
            row["estimated_rebuild_s"] = estimate
            if found is None:
                row.update(verdict="rebuild", why=["unknown provenance: no manifest to compare"])
                out.append(row)
                continue
            facts, _ = await self.current_facts(dep.id)
            try:
                facts["weights_sha256"] = await asyncio.to_thread(
                    self.hasher.hash, Path(found["model"]["checkpoint"])
                )
            except (OSError, KeyError):
                facts["weights_sha256"] = None
            now_reasons = manifest.stale_reasons(found, facts)
            facts.update(change)
            reasons = manifest.stale_reasons(found, facts)
            row["why"] = reasons
            row["stale_now"] = bool(now_reasons)
            unchecked = manifest.unknown_facts(facts)
            if not reasons and unchecked:
                row["verdict"] = "unknown"
                row["why"] = [f"could not check {', '.join(unchecked)}"]
            elif not reasons:
                row["verdict"] = "serves"
            else:
                inputs = manifest.manifest_inputs(found)
                inputs.update({k: facts.get(k) for k in manifest.FACTS})
                if facts.get("weights_sha256"):
                    inputs["weights_sha256"] = facts["weights_sha256"]
                key = manifest.build_key(inputs)
                drill = self.drill_for(dep.id)
                roots = {Path(dep.engine_dir).expanduser().resolve().parent}  # type: ignore[arg-type]
                if drill is not None:
                    roots.add(Path(drill[1].engine_cache).expanduser())
                hit = next((r / key for r in roots if manifest.read_manifest(r / key)), None)
                row["build_key"] = key
                row["verdict"] = "cache" if hit else "rebuild"
                if hit:
                    row["cached"] = str(hit)
            out.append(row)
        return out


# -- helpers ------------------------------------------------------------------------


def candidate_url(drill: Drill) -> str:
    return f"http://127.0.0.1:{drill.serve_port}"


def benchmark_gates(drill: Drill, bench: dict[str, Any]) -> list[tuple[str, bool, str]]:
    spec = drill.benchmark
    gates = []
    errors = sum(
        (row.get(who) or {}).get("errors", 0) for row in bench["levels"] for who in ("candidate",)
    )
    gates.append(("benchmark errors", errors == 0, f"{errors} failed candidate requests"))
    cold = bench["cold_start_s"]["candidate"]
    if spec.max_cold_start_s is not None:
        ok = cold is not None and cold <= spec.max_cold_start_s
        gates.append(("cold start", ok, f"cold start {cold} s (max {spec.max_cold_start_s:g} s)"))
    top = bench["levels"][-1] if bench["levels"] else None
    for key, limit, label in (
        ("ttft_p95_ms", spec.max_ttft_p95_ratio, "TTFT p95"),
        ("itl_p95_ms", spec.max_itl_p95_ratio, "ITL p95"),
    ):
        if limit is None or top is None:
            continue
        c, b = top["candidate"].get(key), top["baseline"].get(key)
        ratio = c / b if c is not None and b else None
        ok = ratio is not None and ratio <= limit
        shown = "unknown" if ratio is None else f"{ratio:.2f}x"
        gates.append(
            (
                f"{label} ratio",
                ok,
                f"{label} at {top['concurrency']}: {shown} of vLLM (max {limit:g}x)",
            )
        )
    return gates


def sweep_summary(bench: dict[str, Any]) -> list[str]:
    """The cold starts and the highest concurrency, candidate against vLLM, in words."""
    out = []
    cold = bench["cold_start_s"]
    base = (cold.get("baseline") or {}).get("total_s")
    out.append(f"cold start {_num(cold.get('candidate'), 's')} vs vLLM {_num(base, 's')}")
    if bench["levels"]:
        top = bench["levels"][-1]
        c, b = top.get("candidate") or {}, top.get("baseline") or {}
        out.append(
            f"at {top['concurrency']}: TTFT p95 {_num(c.get('ttft_p95_ms'), 'ms')} vs "
            f"{_num(b.get('ttft_p95_ms'), 'ms')}, ITL p95 {_num(c.get('itl_p95_ms'), 'ms')} vs "
            f"{_num(b.get('itl_p95_ms'), 'ms')}, {_num(c.get('tokens_per_s'), 'tok/s')} vs "
            f"{_num(b.get('tokens_per_s'), 'tok/s')}"
        )
    return out


def _num(value: Any, unit: str) -> str:
    return "unknown" if value is None else f"{value:g} {unit}"


def last_json(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict):
                    return data
    return None


async def kill_group(pgid: int, created: float, grace_s: float) -> str:
    """SIGTERM a step's process group; SIGKILL what is left after the grace. Only while
    the group is still the one whose leader started at `created`."""
    started = time.monotonic()
    signal_group(pgid, created, signal.SIGTERM)
    while time.monotonic() - started < grace_s:
        if not group_alive(pgid, created):
            return f"stopped (SIGTERM) in {time.monotonic() - started:.1f} s"
        await asyncio.sleep(0.1)
    signal_group(pgid, created, signal.SIGKILL)
    while group_alive(pgid, created) and time.monotonic() - started < grace_s + 10:
        await asyncio.sleep(0.1)
    return f"killed (SIGKILL) after {grace_s:g} s"


async def capped_output(
    proc: asyncio.subprocess.Process, limit: int, timeout_s: float
) -> bytes | None:
    """A child's whole stdout once it exits (it leads its own session); None, with its
    group killed, if it writes more than `limit` bytes or runs past `timeout_s`."""
    created = _created(proc.pid)
    assert proc.stdout is not None
    stdout = proc.stdout

    async def whole() -> bytes | None:
        data = bytearray()
        while chunk := await stdout.read(64 * 1024):
            data += chunk
            if len(data) > limit:
                return None
        await proc.wait()
        return bytes(data)

    try:
        out = await asyncio.wait_for(whole(), timeout_s)
    except TimeoutError:
        out = None
    if out is None:
        signal_group(proc.pid, created, signal.SIGKILL)
        # Read what is left: a pipe whose reading paused at the limit never reports its
        # end, and wait() would wait for it for ever. Its writers are dead: little is left.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.communicate(), REAP_S)
    return out


def _engine_config(engine: Path) -> dict[str, Any] | None:
    """What TensorRT-LLM's own config.json says, for the record."""
    data = _read_json(engine / "config.json")
    if not data:
        return None
    return {
        "version": data.get("version"),
        "architecture": (data.get("pretrained_config") or {}).get("architecture"),
        "dtype": (data.get("pretrained_config") or {}).get("dtype"),
        "build_config": {
            k: v for k, v in (data.get("build_config") or {}).items() if not isinstance(v, dict)
        },
    }


def _log_header(path: Path, text: str) -> int:
    with path.open("ab") as f:
        f.write(f"--- {time.strftime('%H:%M:%S')} {text} ---\n".encode())
        return f.tell()


def _read_from(path: Path, offset: int, limit: int = 4 << 20) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def tail_since(path: Path, offset: int, lines: int = LOG_TAIL_LINES) -> list[str]:
    return _read_from(path, offset).splitlines()[-lines:]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _delta(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return round(b - a, 4)
    return None


def _created(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0
