"""TensorRT-LLM rebuild drills (job kind `drill.run`).

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

The processes (console.agent.drills.processes) write to the drill's log, which the job's
log route streams. A failure stops the drill with the failing step's last lines.
Whatever way a drill ends, its candidate server is stopped and an unpromoted staging
directory is removed: nothing half-built stays. A killed agent leaves the step's pid in
the job record, and the next agent kills that group when it marks the job failed.
Whether a built engine still fits the node is console.agent.drills.staleness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp

from console.agent.api.auth import child_env
from console.agent.drills import checks as drill_checks
from console.agent.drills import manifest
from console.agent.drills import processes as drill_processes
from console.agent.drills.plan import plan, values
from console.agent.drills.processes import Run, read_json_object
from console.agent.drills.staleness import TrtStaleness, last_json
from console.agent.jobs.kinds import Active, JobContext, JobHost, JobRefused, StepFailed
from console.agent.jobs.preflight import port_check
from console.agent.jobs.store import JobRecord
from console.agent.supervise import processes
from console.core.config.load import Deployment, Drill, Model
from console.core.drills.trtllm_releases import drill_release_problems
from console.core.wire import DrillResult, DrillRun, Job, JobStep

log = logging.getLogger(__name__)

STEPS = ("preflight", "convert", "build", "validate", "benchmark", "promote")


class DrillRunner:
    kinds: tuple[str, ...] = ("drill.run",)

    def __init__(self, host: JobHost, root: Path, trt: TrtStaleness) -> None:
        self.host = host
        self.agent = host.agent
        self.trt = trt  # the node's drills, its facts, and the version probes' answers
        self.root = root / "drills"
        self.root.mkdir(parents=True, exist_ok=True)

    def log_file(self, job_id: str) -> Path:
        return self.root / job_id / "drill.log"

    def log_path(self, job: Job) -> Path | None:
        return self.log_file(job.id)

    # -- submitting -----------------------------------------------------------------

    async def submit(self, request: DrillRun, who: str) -> Active:
        name = request.drill
        mine = self.trt.drills()
        if name not in mine:
            if name in self.agent.fleet.drills:
                raise JobRefused(404, f"drill: {name} rebuilds a deployment on another node")
            raise JobRefused(
                404,
                f"drill: no drill {name!r} on node {self.agent.node} ({', '.join(mine) or 'none'})",
            )
        drill = mine[name]
        for job_id, active in self.host.active.items():
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
        record = self.host.store.create_job("drill.run", who, {"drill": name})
        result = DrillResult(drill=name, deployment=drill.deployment, model=drill.model)
        active = Active(
            record,
            [JobStep(name=s) for s in STEPS],
            result=result.model_dump(include={"drill", "deployment", "model"}),
        )
        (self.root / record.id).mkdir(parents=True, exist_ok=True)
        self.host.run(active, lambda ctx: self._run(ctx, name, drill), log=self.log_file(record.id))
        return active

    def resume(self, record: JobRecord) -> bool:
        return False  # a drill's steps cannot be picked up halfway: it is marked failed

    def interrupted(self, record: JobRecord) -> list[str]:
        """Kill the step and candidate groups a killed agent left running."""
        return drill_processes.kill_left((record.result or {}).get("result", {}))

    async def cancelled(self, ctx: JobContext) -> None:
        """Nothing more to do: the drill's own `finally` stops its processes."""

    # -- running --------------------------------------------------------------------

    async def _run(self, ctx: JobContext, name: str, drill: Drill) -> None:
        job_id = ctx.record.id
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
            self.agent.fleet.agent,
        )
        run.dir.mkdir(parents=True, exist_ok=True)
        engine_stage = run.staging / "engine"
        ckpt = engine_stage if drill.pipeline == "pytorch" else run.staging / "checkpoint"
        found = values(drill, run.served, engine_stage, ckpt, engine_stage)
        run.steps = plan(drill, found)
        result = ctx.result
        result["gates"] = []
        result["step_runs"] = {}
        result["staging_dir"] = str(run.staging)
        promoted = False
        try:
            key, hit = await self._preflight(ctx, run, cache)
            engine_dir = cache.path(key) if hit else engine_stage
            if drill.pipeline == "pytorch" and not hit and run.steps["convert"].skip:
                engine_dir = Path(found["checkpoint"])
            found["engine_dir"] = str(engine_dir)
            run.steps = plan(drill, found)
            if hit:
                why = f"cache hit: serve from cache {cache.path(key)}"
                for step in ("convert", "build"):
                    ctx.skip(step, why)
            else:
                await self._convert(ctx, run)
                engine_stage.mkdir(parents=True, exist_ok=True)
                await self._build(ctx, run)
                self._manifest(ctx, run, engine_stage, key)
            await self._validate(ctx, run)
            await self._benchmark(ctx, run)
            await drill_processes.stop_candidate(ctx, run)
            promoted = await self._promote(ctx, run, cache, key, hit)
            result["time_to_rebuild_s"] = round(time.time() - ctx.record.created, 3)
        finally:
            await drill_processes.cleanup(ctx, run, promoted)
            self.trt.probed.pop(name, None)
            with contextlib.suppress(Exception):
                await self.trt.refresh()

    async def _preflight(
        self, ctx: JobContext, run: Run, cache: manifest.EngineCache
    ) -> tuple[str, bool]:
        drill = run.drill
        step = ctx.begin("preflight")
        output = await drill_processes.run_step(ctx, run, run.steps["preflight"])
        probed = last_json(output)
        if probed is None:
            raise StepFailed(
                "preflight: the version probe printed no JSON line",
                log_tail=processes.tail(run.log),
            )
        if not probed.get("tensorrt_llm"):
            why = probed.get("error_tensorrt_llm") or "it printed no tensorrt_llm version"
            raise StepFailed(f"preflight: TensorRT-LLM is not importable on this node: {why}")
        self.trt.probed[ctx.result["drill"]] = (time.time(), probed)
        facts, sources = await self.trt.facts(probed)
        ctx.result["versions"] = facts
        ctx.result["version_sources"] = sources
        pins = drill.pins.model_dump()
        mismatches = [
            f"{manifest.FACT_NAMES[k]} pinned {want}, node has {facts.get(k) or 'unknown'}"
            for k, want in pins.items()
            if want is not None and str(facts.get(k)) != str(want)
        ]
        pinned = [manifest.FACT_NAMES[k] for k, want in pins.items() if want is not None]
        matched = f"{', '.join(pinned)} match the pins" if pinned else "no pins declared"
        ctx.gate("pins", not mismatches, "; ".join(mismatches) or matched)
        if mismatches:
            raise StepFailed("preflight: " + "; ".join(mismatches))
        # fleet.toml refuses this where the drill pins the release; here, where it does not.
        cannot = drill_release_problems(drill, str(facts.get("tensorrt_llm")))
        if cannot:
            raise StepFailed(f"preflight: drill {run.name}: " + "; ".join(w for _, w in cannot))
        problems = []
        port = port_check(drill.serve_port)
        if not port.ok:
            problems.append(f"serve_port: {port.detail}")
        checkpoint = Path(drill.checkpoint).expanduser()
        try:
            weights = await asyncio.to_thread(self.trt.hasher.hash, checkpoint)
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
                ctx.result["cache_problem"] = "; ".join(bad)
        ctx.result.update(
            build_key=key,
            key_inputs=inputs,
            weights_sha256=weights,
            cache="hit" if hit else "miss",
        )
        shown = ", ".join(f"{manifest.FACT_NAMES[k]} {facts.get(k) or '?'}" for k in manifest.FACTS)
        verdict = "cache hit: serve from cache" if hit else "cache miss: build"
        ctx.end(step, f"{shown}; key {key}; {verdict}")
        return key, hit

    async def _convert(self, ctx: JobContext, run: Run) -> None:
        planned = run.steps["convert"]
        if planned.skip:
            ctx.skip("convert", planned.skip)
            return
        step = ctx.begin("convert")
        await drill_processes.run_step(ctx, run, planned)
        ctx.end(step, drill_processes.timing_text(ctx, "convert"))

    async def _build(self, ctx: JobContext, run: Run) -> None:
        step = ctx.begin("build")
        planned = run.steps["build"]
        if planned.argv is not None:
            await drill_processes.run_step(ctx, run, planned)
            ctx.end(step, drill_processes.timing_text(ctx, "build"))
            return
        # The PyTorch pipeline: the "build" is the server's cold start and its warm-up.
        cold = await drill_processes.start_candidate(ctx, run)
        warm = await drill_processes.warm_up(run)
        ctx.end(step, f"cold start {cold:.1f} s; warm-up {warm:.1f} s")

    def _manifest(self, ctx: JobContext, run: Run, engine: Path, key: str) -> None:
        drill = run.drill
        facts = ctx.result["versions"]
        build = ctx.step("build")
        written = manifest.write_manifest(
            engine,
            {
                "schema": 1,
                "build_key": key,
                "drill": run.name,
                "job_id": ctx.record.id,
                "node": self.agent.node,
                "built": time.time(),
                "build_s": round((build.ended or time.time()) - (build.started or time.time()), 3),
                "model": {
                    "name": drill.model,
                    "checkpoint": str(Path(drill.checkpoint).expanduser()),
                    "weights_sha256": ctx.result["weights_sha256"],
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
                "engine_config": engine_config(engine),
            },
        )
        ctx.result["manifest"] = {
            "path": str(engine / manifest.MANIFEST),
            "files": written["files"],
        }
        ctx.save()

    async def _validate(self, ctx: JobContext, run: Run) -> None:
        step = ctx.begin("validate")
        if "candidate" not in run.processes:
            await drill_processes.start_candidate(ctx, run)
        baseline = self._baseline(run)
        ctx.result["baseline"] = {"deployment": baseline[0].id, "endpoint": baseline[0].endpoint}
        spec = run.drill.validate_
        try:
            found = await drill_checks.validate(
                (drill_processes.candidate_url(run.drill), run.served),
                (baseline[0].endpoint, baseline[1]),
                spec.prompts,
                spec.max_tokens,
                spec.first_n,
                spec.timeout_s,
            )
        except (TimeoutError, drill_checks.CheckFailed, aiohttp.ClientError) as exc:
            raise StepFailed(f"validate: {str(exc) or type(exc).__name__}") from None
        ctx.result["validate"] = found
        exact, first = found["exact_match"] or 0.0, found["first_n_agreement"] or 0.0
        ok = exact >= spec.min_exact_match and first >= spec.min_first_n
        detail = (
            f"exact match {exact:.0%} (min {spec.min_exact_match:.0%}), first {spec.first_n} "
            f"{found['unit']} agree {first:.0%} (min {spec.min_first_n:.0%}) over "
            f"{found['prompts']} prompts"
        )
        ctx.gate("validate", ok, detail)
        if not ok:
            step.detail = detail
            raise StepFailed(f"validate: agreement below the threshold: {detail}")
        ctx.end(step, detail)

    def _baseline(self, run: Run) -> tuple[Deployment, str]:
        """The deployment the candidate is compared with, and its name for the model."""
        model, wanted = run.model, run.drill.baseline
        if wanted is not None:
            dep = next(d for d in model.deployments if d.id == wanted)
        else:
            dep = next(d for d in model.deployments if d.engine == "vllm")
        return dep, dep.engine_model or model.name

    async def _benchmark(self, ctx: JobContext, run: Run) -> None:
        drill, model = run.drill, run.model
        step = ctx.begin("benchmark")
        spec = drill.benchmark
        baseline, baseline_model = self._baseline(run)
        levels: list[dict[str, Any]] = []
        bench: dict[str, Any] = {
            "cold_start_s": {
                "candidate": ctx.result.get("candidate_cold_start_s"),
                "baseline": self._baseline_cold_start(baseline, model),
            },
            "levels": levels,
        }
        ctx.result["benchmark"] = bench
        deadline = time.monotonic() + spec.timeout_s
        for level in spec.concurrency:
            n = drill_checks.requests_for(level, spec.requests_per_level)
            row: dict[str, Any] = {"concurrency": level, "requests": n}
            for who, url, name in (
                ("candidate", drill_processes.candidate_url(drill), run.served),
                ("baseline", baseline.endpoint, baseline_model),
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StepFailed(f"benchmark: not done within {spec.timeout_s:g} s")
                step.detail = f"concurrency {level}: {who}"
                ctx.save()
                row[who] = await drill_checks.sweep_level(
                    url, name, level, n, spec.max_tokens, spec.prompt, left
                )
            levels.append(row)
            ctx.save()
        gates = drill_checks.benchmark_gates(drill, bench)
        for gate, ok, detail in gates:
            ctx.gate(gate, ok, detail)
        failed = [d for _, ok, d in gates if not ok]
        detail = "; ".join([*(d for _, _, d in gates), *drill_checks.sweep_summary(bench)])
        if failed:
            step.detail = detail
            raise StepFailed("benchmark: " + "; ".join(failed))
        ctx.end(step, detail)

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
        for record in self.host.store.jobs(500, ("vllm.start", "engine.restart")):
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
        self, ctx: JobContext, run: Run, cache: manifest.EngineCache, key: str, hit: bool
    ) -> bool:
        drill, deployment = run.drill, run.deployment
        step = ctx.begin("promote")
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
        ctx.result["promoted"] = {"path": str(target), "link": link}
        ctx.end(step, f"{key} {how}; {link}")
        return True


def engine_config(engine: Path) -> dict[str, Any] | None:
    """What TensorRT-LLM's own config.json says, for the record."""
    data = read_json_object(engine / "config.json")
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
