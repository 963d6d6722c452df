"""The processes of a drill: its steps' tools and its candidate server.

Each runs under the log capper (console.agent.supervise.logcap) in a session of its own, writing to
the drill's log. A timeout or a cancel stops the process's whole group
(console.agent.supervise.processes.terminate, after `[agent] stop_grace_s`). The job's result
lists every group still running (pid and start time), so that the next agent kills what
a killed one left (`kill_left`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from console.agent.drills import checks as drill_checks
from console.agent.drills.plan import PlannedStep
from console.agent.jobs.kinds import JobContext, StepFailed, ready
from console.agent.supervise import processes
from console.agent.supervise.processes import Group
from console.core.config.load import AgentSection, Deployment, Drill, Model

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
    settings: AgentSection  # log caps, and the grace from SIGTERM to SIGKILL
    steps: dict[str, PlannedStep] = field(default_factory=dict)  # filled templates
    processes: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> pgid

    @property
    def log(self) -> Path:
        return self.dir / "drill.log"


async def run_step(ctx: JobContext, run: Run, planned: PlannedStep) -> str:
    """Run one step's argv under the log capper; its output (since it started)."""
    assert planned.argv is not None
    name = planned.name
    offset = ctx.log(f"step {name}: {shlex.join(planned.argv)}")
    status_path = run.dir / f"{name}.status.json"
    status_path.unlink(missing_ok=True)
    spawned = time.time()
    proc = await spawn(ctx, run, name, planned.argv, status_path)
    try:
        await asyncio.wait_for(proc.wait(), planned.timeout_s)
    except TimeoutError:
        how = await kill(ctx, run, name)
        raise StepFailed(
            f"{name}: no result within {planned.timeout_s:g} s; {how}",
            log_tail=processes.tail_since(run.log, offset),
        ) from None
    except BaseException:  # cancelled: the step's whole group goes with the job
        await kill(ctx, run, name)
        raise
    recorded = time.time()
    run.processes.pop(name, None)
    status = read_json_object(status_path)
    code = status.get("exit_code", proc.returncode)
    timing = {
        "argv": planned.argv,
        "exit_code": code,
        "duration_s": round(recorded - spawned, 3),
        "spawn_to_first_output_s": _delta(spawned, status.get("first_output")),
        "exit_to_recorded_s": _delta(status.get("ended"), recorded),
    }
    ctx.result["step_runs"][name] = timing
    ctx.save()
    output = processes.since(run.log, offset)
    if code != 0:
        raise StepFailed(
            f"{name}: exited with code {code}", log_tail=processes.tail_since(run.log, offset)
        )
    missing = [str(p) for p in planned.expect_files if not p.exists()]
    if missing:
        raise StepFailed(
            f"{name}: exited 0 but did not write {', '.join(missing)}",
            log_tail=processes.tail_since(run.log, offset),
        )
    if planned.expect_output and not re.search(planned.expect_output, output):
        raise StepFailed(
            f"{name}: its output never matched {planned.expect_output!r}",
            log_tail=processes.tail_since(run.log, offset),
        )
    return output


async def spawn(
    ctx: JobContext, run: Run, name: str, argv: list[str], status: Path
) -> asyncio.subprocess.Process:
    settings = run.settings
    capper = [
        sys.executable,
        "-m",
        "console.agent.supervise.logcap",
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
    run.processes[name] = (proc.pid, processes.created(proc.pid))
    ctx.result["processes"] = {k: list(v) for k, v in run.processes.items()}
    ctx.save()  # a later agent kills what a killed one left running
    return proc


async def kill(ctx: JobContext, run: Run, name: str) -> str:
    pgid, created = run.processes.pop(name, (None, 0.0))
    ctx.result["processes"] = {k: list(v) for k, v in run.processes.items()}
    if pgid is None:
        return "not running"
    return await processes.terminate(Group(pgid, created), run.settings.stop_grace_s)


async def start_candidate(ctx: JobContext, run: Run) -> float:
    """Start the candidate server; its cold start (spawn to ready) in seconds."""
    serve = run.steps["serve"]
    assert serve.argv is not None
    offset = ctx.log(f"candidate: {shlex.join(serve.argv)}")
    status = run.dir / "candidate.status.json"
    status.unlink(missing_ok=True)
    started = time.time()
    proc = await spawn(ctx, run, "candidate", serve.argv, status)
    url = candidate_url(run.drill)
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.returncode is not None:
                run.processes.pop("candidate", None)
                code = read_json_object(status).get("exit_code", proc.returncode)
                raise StepFailed(
                    f"candidate: trtllm-serve exited with code {code} before it was ready",
                    log_tail=processes.tail_since(run.log, offset),
                )
            if await ready(http, url, run.served):
                break
            if time.time() - started > serve.timeout_s:
                how = await kill(ctx, run, "candidate")
                raise StepFailed(
                    f"candidate: not ready within {serve.timeout_s:g} s; {how}",
                    log_tail=processes.tail_since(run.log, offset),
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 0.1)
    cold = round(time.time() - started, 3)
    ctx.result["candidate_cold_start_s"] = cold
    ctx.save()
    return cold


async def warm_up(run: Run) -> float:
    started = time.monotonic()
    with contextlib.suppress(drill_checks.CheckFailed, aiohttp.ClientError):
        await drill_checks.sweep_level(
            candidate_url(run.drill), run.served, 1, WARMUP_REQUESTS, 8, "warm up", 300
        )
    return time.monotonic() - started


async def stop_candidate(ctx: JobContext, run: Run) -> None:
    if "candidate" in run.processes:
        ctx.result["candidate_stop"] = await kill(ctx, run, "candidate")
        ctx.save()


async def cleanup(ctx: JobContext, run: Run, promoted: bool) -> None:
    for name in list(run.processes):
        ctx.result.setdefault("killed", {})[name] = await kill(ctx, run, name)
    if run.staging.exists():
        await asyncio.to_thread(shutil.rmtree, run.staging, True)
        if not promoted:
            ctx.result["staging"] = f"removed {run.staging}"
    with contextlib.suppress(OSError):
        run.staging.parent.rmdir()  # .staging, when no other drill uses it


def kill_left(result: dict[str, Any]) -> list[str]:
    """A job a killed agent left open: kill its step and candidate groups."""
    done = []
    for name, (pgid, created) in (result.get("processes") or {}).items():
        if processes.kill_now(Group(pgid, created)):  # only if it is still that group
            done.append(f"{name} (process group {pgid}) killed")
    staging = result.get("staging_dir")
    if isinstance(staging, str):
        shutil.rmtree(staging, ignore_errors=True)
    return done


def timing_text(ctx: JobContext, name: str) -> str:
    t = ctx.result["step_runs"].get(name, {})
    return f"exit {t.get('exit_code')} after {t.get('duration_s', 0):.1f} s"


def candidate_url(drill: Drill) -> str:
    return f"http://127.0.0.1:{drill.serve_port}"


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file's object, or {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _delta(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return round(b - a, 4)
    return None
