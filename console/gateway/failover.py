"""Failover jobs: move a model's traffic to another deployment without dropping a request.

Planned (`mode: planned`):
  1. preflight: the target answers its health check and serves the model; a canary
     completion through it meets the model's TTFT SLO; its queue and KV cache have room;
  2. warm-up: `warmup_requests` requests to the target;
  3. shift in steps (default 10%, 50%, 100%), each followed by a verification window in
     which the target's error rate and p95 TTFT/ITL, as the gateway measured them, must
     meet the SLO; a breach rolls back to the weights from before the job and fails it
     with the numbers;
  4. drain: the source takes no new requests; wait until its in-flight count is zero;
  5. done: before and after routes, timings, the verification figures.
Emergency (`mode: emergency`): the target's health check, then all weight at once.

Jobs run in the gateway, so a console that disconnects changes nothing. One failover per
model at a time. Every weight change is audited with the job id.

The jobs drive the model's data plane (console.gateway.dataplane): the built-in gateway's
route table by default, or HAProxy, or the vLLM router, as fleet.toml names it. For those
the gateway stays the controller (admin API, jobs, audit, health checks of every engine)
and is not in the traffic's path. Trouble with the data plane itself fails the job with
its words.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

import aiohttp

from console.gateway import triton_openai as tri
from console.gateway.dataplane import (
    BUILTIN,
    DataPlane,
    DataPlaneError,
    DrainTimeout,
    Figures,
    plane_class,
)
from console.gateway.dp_builtin import BuiltinPlane
from console.gateway.routetable import RouteTable
from console.gateway.upstream import Upstream, check
from plugins import load_plugins
from plugins.base import EngineTarget, ProbeContext

log = logging.getLogger(__name__)

KV_FULL = 0.9  # a target whose KV cache is fuller than this has no room


class FailoverRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class StepFailed(Exception):
    pass


class Failovers:
    """The failover jobs of one gateway, over each model's data plane. `http` (the
    gateway's client session, for health checks, canaries and engine metrics) is set once
    the gateway has started."""

    def __init__(self, table: RouteTable) -> None:
        self.table = table
        self.http: aiohttp.ClientSession | None = None
        self.running: dict[str, str] = {}  # model -> job id
        self.live: dict[str, dict[str, Any]] = {}  # job id -> its live record
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.planes: dict[str, DataPlane] = {BUILTIN: BuiltinPlane(table)}
        for section in table.fleet.dataplanes:
            self.planes[section.name] = plane_class(section.kind)(section, table.fleet, table.store)
        self._started: set[str] = set()  # planes whose start() ran
        self._auto: set[asyncio.Task[None]] = set()

    async def plane(self, model: str) -> DataPlane:
        """The model's data plane, started on first use inside the gateway's loop."""
        plane = self.planes[self.table.models[model].dataplane]
        if plane.name not in self._started:
            assert self.http is not None
            self._started.add(plane.name)
            await plane.start(self.http)
            if plane.kind != BUILTIN:  # the gateway's routes show the weights in force there
                for name, m in self.table.models.items():
                    if m.dataplane == plane.name:
                        with contextlib.suppress(DataPlaneError):
                            self.table.weights[name] = await plane.weights(name)
        return plane

    # -- bookkeeping -------------------------------------------------------------------

    def settle_interrupted(self) -> None:
        for record in self.table.store.interrupted():
            stored = dict(record.result or {})
            stored["error"] = (
                "the gateway stopped during this failover; the routes are as its last "
                "completed step left them"
            )
            self.table.store.update_job(record.id, "failed", stored)

    def job(self, job_id: str) -> dict[str, Any] | None:
        if job_id in self.live:
            return self.live[job_id]
        record = self.table.store.job(job_id)
        if record is None:
            return None
        return {
            "id": record.id,
            "kind": record.kind,
            "state": record.state,
            "who": record.who,
            "created": record.created,
            "updated": record.updated,
            "params": record.params,
            **(record.result or {}),
        }

    def jobs(self) -> list[dict[str, Any]]:
        return [j for r in self.table.store.jobs(50) if (j := self.job(r.id)) is not None]

    def _save(self, job: dict[str, Any]) -> None:
        job["updated"] = time.time()
        keep = {k: v for k, v in job.items() if k not in ("id", "kind", "state", "who", "params")}
        self.table.store.update_job(job["id"], job["state"], json.loads(json.dumps(keep)))

    async def close(self) -> None:
        for task in [*self.tasks.values(), *self._auto]:
            task.cancel()
        await asyncio.gather(*self.tasks.values(), *self._auto, return_exceptions=True)
        for plane in self.planes.values():
            with contextlib.suppress(Exception):
                await plane.close()

    async def cancel(self, job_id: str) -> dict[str, Any]:
        task = self.tasks.get(job_id)
        if task is None:
            raise FailoverRefused(409, f"job {job_id} is not running")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return self.job(job_id) or {}

    # -- starting ----------------------------------------------------------------------

    def start(self, model: str, to: str, mode: str, who: str, why: str) -> dict[str, Any]:
        if model not in self.table.models:
            raise FailoverRefused(404, f"no model {model!r}")
        if mode not in ("planned", "emergency"):
            raise FailoverRefused(422, f"mode: wants planned or emergency, got {mode!r}")
        target = self.table.upstream(model, to)
        if target is None:
            known = ", ".join(u.id for u in self.table.upstreams[model])
            raise FailoverRefused(404, f"to: {model} has no deployment {to!r} ({known})")
        if (running := self.running.get(model)) is not None:
            raise FailoverRefused(
                409, f"a failover of {model} is already running (job {running}); wait or cancel"
            )
        params = {"model": model, "to": to, "mode": mode, "why": why}
        record = self.table.store.create_job(f"failover.{mode}", who, params)
        shifts = [f"shift {p}%" for p in self.table.models[model].failover.steps]
        steps = (
            ["preflight", "warmup", *shifts, "drain", "done"]
            if mode == "planned"
            else ["readiness", "shift 100%", "done"]
        )  # fmt: skip
        job: dict[str, Any] = {
            "id": record.id,
            "kind": record.kind,
            "state": "running",
            "who": who,
            "created": record.created,
            "params": params,
            "steps": [
                {"name": s, "state": "pending", "started": None, "ended": None, "detail": None}
                for s in steps
            ],
            "dataplane": self.table.models[model].dataplane,
            "dataplane_is": self.planes[self.table.models[model].dataplane].describe(),
            "before": None,  # the data plane's weights, read as the job begins
            "after": None,
            "sources": [],
            "verification": [],
            "error": None,
        }
        self.live[record.id] = job
        self.running[model] = record.id
        self._save(job)
        work = (
            self._planned(job, model, target)
            if mode == "planned"
            else self._emergency(job, model, target)
        )
        self.tasks[record.id] = asyncio.create_task(self._guard(job, model, work))
        return job

    async def plan(self, model: str, to: str) -> dict[str, Any]:
        """The planned failover's preflight alone (health, canary, room): what the console
        shows before anyone confirms. Changes no route."""
        if model not in self.table.models:
            raise FailoverRefused(404, f"no model {model!r}")
        target = self.table.upstream(model, to)
        if target is None:
            raise FailoverRefused(404, f"to: {model} has no deployment {to!r}")
        scratch: dict[str, Any] = {"steps": [{"name": "preflight", "state": "running"}]}
        step = scratch["steps"][0]
        plane = await self.plane(model)
        where = {"dataplane": plane.describe(), "figures_from": plane.figures_from(model)}
        try:
            detail = await self._preflight(scratch, step, model, target, save=False)
        except StepFailed as exc:
            return {"ok": False, "detail": str(exc).removeprefix("preflight: "), **where}
        except DataPlaneError as exc:
            return {"ok": False, "detail": f"data plane {plane.name}: {exc}", **where}
        return {"ok": True, "detail": detail, **where}

    def maybe_auto(self, down: Upstream) -> None:
        """A deployment went down: with auto_failover, move its weight to a healthy one."""
        model = self.table.models.get(down.model)
        if model is None or not model.auto_failover or down.model in self.running:
            return
        if model.dataplane == BUILTIN:  # its weights are at hand: decide now
            self._auto_to(down, self.table.weights[down.model])
            return
        task = asyncio.create_task(self._auto_elsewhere(down))
        self._auto.add(task)
        task.add_done_callback(self._auto.discard)

    async def _auto_elsewhere(self, down: Upstream) -> None:
        try:
            weights = await (await self.plane(down.model)).weights(down.model)
        except DataPlaneError as exc:
            log.warning("auto failover of %s: its data plane: %s", down.model, exc)
            return
        self._auto_to(down, weights)

    def _auto_to(self, down: Upstream, weights: dict[str, int]) -> None:
        if weights.get(down.id, 0) == 0 or down.model in self.running:
            return
        healthy = [u for u in self.table.upstreams[down.model] if u.up and u.id != down.id]
        if not healthy:
            return
        target = max(healthy, key=lambda u: weights.get(u.id, 0))
        with contextlib.suppress(FailoverRefused):
            self.start(down.model, target.id, "emergency", "auto", f"{down.id}: {down.reason}")

    async def _guard(self, job: dict[str, Any], model: str, work: Any) -> None:
        plane: DataPlane | None = None
        try:
            plane = await self.plane(model)
            await plane.begin(model)
            job["before"] = await plane.weights(model)
            job["sources"] = [
                u.id
                for u in self.table.upstreams[model]
                if u.id != job["params"]["to"] and job["before"].get(u.id, 0) > 0
            ]
            await work
            state, error = "succeeded", None
        except StepFailed as exc:
            state, error = "failed", str(exc)
        except DataPlaneError as exc:
            where = plane.name if plane is not None else "?"
            state, error = "failed", f"data plane {where}: {exc}"
        except asyncio.CancelledError:
            state, error = "cancelled", "cancelled; the routes stay as they are"
        except Exception as exc:
            log.exception("failover %s", job["id"])
            state, error = "failed", f"internal error: {exc!r}"[:300]
        for step in job["steps"]:
            if step["state"] == "running":
                step["state"], step["ended"] = (
                    ("failed" if state == "failed" else "cancelled"),
                    time.time(),
                )
            elif step["state"] == "pending":
                step["state"] = "skipped"
        after = await self._weights_after(plane, model)
        if plane is not None and plane.kind != BUILTIN and after is not None:
            self.table.weights[model] = dict(after)
        # The job reads as ended only once everything about its end is in it: the admin
        # API serves this dict while the weights above are read.
        job["after"] = after
        if error is not None:
            job["error"] = error
        job["state"] = state
        self._save(job)
        self.running.pop(model, None)
        self.tasks.pop(job["id"], None)
        self.live.pop(job["id"], None)

    async def _weights_after(self, plane: DataPlane | None, model: str) -> dict[str, int] | None:
        if plane is None:
            return None
        try:
            async with asyncio.timeout(10):
                return await plane.weights(model)
        except (DataPlaneError, TimeoutError):
            return None  # unknown: the error says why

    def _step(self, job: dict[str, Any], name: str) -> dict[str, Any]:
        step = next(s for s in job["steps"] if s["name"] == name)
        step["state"], step["started"] = "running", time.time()
        self._save(job)
        return step

    def _done(self, job: dict[str, Any], step: dict[str, Any], detail: str) -> None:
        step["state"], step["ended"], step["detail"] = "succeeded", time.time(), detail
        self._save(job)

    def _fail(self, job: dict[str, Any], step: dict[str, Any], detail: str) -> StepFailed:
        step["detail"] = detail
        return StepFailed(f"{step['name']}: {detail}")

    # -- the steps ---------------------------------------------------------------------

    async def _emergency(self, job: dict[str, Any], model: str, target: Upstream) -> None:
        started = time.monotonic()
        plane = await self.plane(model)
        step = self._step(job, "readiness")
        assert self.http is not None
        problem = await check(self.http, target, 2.0)
        if problem is not None:
            raise self._fail(job, step, f"{target.id} is not ready: {problem}")
        target.mark_up()
        self._done(job, step, f"{target.id} answers its health check")
        step = self._step(job, "shift 100%")
        served_before = await plane.started(model, target.id)
        await self._all_to(job, plane, model, target)
        cutover = time.monotonic() - started
        self._done(job, step, f"all weight on {target.id} {cutover * 1000:.0f} ms after start")
        job["cutover_s"] = round(cutover, 4)
        step = self._step(job, "done")
        if served_before is None:
            job["first_served_s"] = None
            self._done(job, step, f"{plane.name} does not count requests per deployment")
            return
        first = await _first_served(plane, model, target, served_before, 5.0)
        job["first_served_s"] = None if first is None else round(first - started, 4)
        self._done(
            job,
            step,
            "no request reached the target within 5 s (no traffic?)"
            if first is None
            else f"the target answered its first request {first - started:.3f} s after the command",
        )

    async def _all_to(
        self, job: dict[str, Any], plane: DataPlane, model: str, target: Upstream
    ) -> None:
        weights = {u.id: (100 if u.id == target.id else 0) for u in self.table.upstreams[model]}
        await self._set(
            plane, model, weights, job["who"], f"failover {job['id']}: all to {target.id}"
        )

    async def _planned(self, job: dict[str, Any], model: str, target: Upstream) -> None:
        plane = await self.plane(model)
        plan = self.table.models[model].failover
        slo = self.table.models[model].slo
        timings: dict[str, float] = {}
        t = time.monotonic()
        step = self._step(job, "preflight")
        detail = await self._preflight(job, step, model, target)
        self._done(job, step, detail)
        timings["preflight_s"] = time.monotonic() - t

        t = time.monotonic()
        step = self._step(job, "warmup")
        failures = 0
        for _ in range(plan.warmup_requests):
            ok, _, _ = await self.canary(target, plan.canary_prompt)
            failures += 0 if ok else 1
        if failures:
            raise self._fail(
                job, step, f"{failures} of {plan.warmup_requests} warm-up requests failed"
            )
        self._done(job, step, f"{plan.warmup_requests} requests answered")
        timings["warmup_s"] = time.monotonic() - t

        before = dict(job["before"])
        others = [u for u in self.table.upstreams[model] if u.id != target.id]
        for pct in plan.steps:
            t = time.monotonic()
            step = self._step(job, f"shift {pct}%")
            await self._set(
                plane, model, _split(before, others, target, pct), job["who"],
                f"failover {job['id']}: {pct}% to {target.id}",
            )  # fmt: skip
            figures = await self._verify(plane, model, target, plan.verify_s, plan.canary_prompt)
            job["verification"].append({"step": pct, **figures})
            breach = _breach(figures, slo, self.table.fleet.thresholds.error_rate)
            if breach:
                why = f"failover {job['id']}: rolled back ({breach})"
                try:
                    await self._set(plane, model, before, job["who"], why)
                except DataPlaneError as exc:
                    raise self._fail(
                        job, step, f"SLO breached at {pct}%: {breach}; the rollback failed: {exc}"
                    ) from None
                job["rolled_back"] = True
                raise self._fail(job, step, f"SLO breached at {pct}%: {breach}; rolled back")
            self._done(job, step, _figure_text(figures))
            timings[f"shift_{pct}_s"] = time.monotonic() - t

        t = time.monotonic()
        step = self._step(job, "drain")
        deadline = time.monotonic() + plan.drain_timeout_s
        left: dict[str, int | None] = {}
        for u in others:
            try:
                await plane.drain(model, u.id, max(0.0, deadline - time.monotonic()))
            except DrainTimeout as exc:
                left.update(exc.left)
        if left:
            raise self._fail(job, step, f"still in flight after {plan.drain_timeout_s:g} s: {left}")
        self._done(job, step, f"no request in flight on {', '.join(u.id for u in others)}")
        timings["drain_s"] = time.monotonic() - t
        step = self._step(job, "done")
        job["timings"] = {k: round(v, 3) for k, v in timings.items()}
        self._done(job, step, f"{model} now served by {target.id}")

    async def _set(
        self, plane: DataPlane, model: str, weights: dict[str, int], who: str, why: str
    ) -> None:
        await plane.set_weights(model, weights, who, why)
        if plane.kind != BUILTIN:  # the gateway's routes show what its jobs set elsewhere
            self.table.weights[model] = {**self.table.weights[model], **weights}

    async def _verify(
        self, plane: DataPlane, model: str, target: Upstream, seconds: float, prompt: str
    ) -> dict[str, Any]:
        """The verification window after a shift: the data plane's figures for the target;
        with no traffic in the window, three canaries straight to it decide."""
        since = await plane.snapshot(model, target.id)
        await asyncio.sleep(seconds)
        figures = await plane.figures(model, target.id, since)
        if figures.requests:
            return _figures(figures)
        canaries = [await self.canary(target, prompt, through_measures=True) for _ in range(3)]
        figures = await plane.figures(model, target.id, since)
        if figures.requests:
            return _figures(figures)
        # The data plane saw none (the canaries went straight to the target): their own
        # outcomes, and the latencies the data plane's source saw where it has them.
        failed = sum(1 for ok, _, _ in canaries if not ok)
        ttfts = sorted(t for ok, t, _ in canaries if ok and t is not None)
        ttft = figures.ttft_p95_s
        if ttft is None and ttfts:
            ttft = ttfts[-1]
        return _figures(
            Figures(3, failed, failed / 3, ttft, figures.itl_p95_s,
                    f"3 canaries straight to the target (no traffic in the window); "
                    f"latency: {figures.source}")
        )  # fmt: skip

    async def _preflight(
        self,
        job: dict[str, Any],
        step: dict[str, Any],
        model: str,
        target: Upstream,
        save: bool = True,
    ) -> str:
        assert self.http is not None
        plane = await self.plane(model)
        health = await plane.health()
        if not health.ok:
            raise self._fail(job, step, f"data plane {plane.name}: {health.detail}")
        problem = await check(self.http, target, 2.0)
        if problem is not None:
            hint = (
                f"; it has launch profile {target.dep.profile}: start it first "
                f"(engineroom vllm start --node {target.dep.node} --profile {target.dep.profile})"
                if target.dep.profile
                else ""
            )
            raise self._fail(job, step, f"{target.id} is not ready: {problem}{hint}")
        if save:
            target.mark_up()
        slo = self.table.models[model].slo
        ok, ttft, error = await self.canary(target, self.table.models[model].failover.canary_prompt)
        if not ok:
            raise self._fail(job, step, f"the canary through {target.id} failed: {error}")
        assert ttft is not None
        if slo.ttft_p95_ms is not None and ttft * 1000 > slo.ttft_p95_ms:
            raise self._fail(
                job, step,
                f"canary TTFT {ttft * 1000:.0f} ms is over the SLO ({slo.ttft_p95_ms:g} ms)",
            )  # fmt: skip
        room = await self._room(target)
        if room is not None and not room[0]:
            raise self._fail(job, step, room[1])
        backends = await plane.backends(model)
        inflight = [b.inflight for d, b in backends.items() if d != target.id]
        now = "?" if any(n is None for n in inflight) else str(sum(n or 0 for n in inflight))
        return (
            f"{target.id} healthy and serving; canary TTFT {ttft * 1000:.0f} ms; "
            f"{room[1] if room else 'capacity unknown (no metrics)'}; "
            f"in flight on the others {now}; data plane: {plane.describe()}"
        )

    async def _room(self, target: Upstream) -> tuple[bool, str] | None:
        """(room?, what was seen) from the target engine's own metrics; None if unknown."""
        plugin = load_plugins().get(target.kind)
        if plugin is None or self.http is None:
            return None
        ctx = ProbeContext(self.http, 2.0, 8 * 1024 * 1024)
        metrics = target.dep.metrics_endpoint
        reading = await plugin.probe(
            EngineTarget(target.id, target.kind, target.dep.endpoint, metrics,
                         [target.engine_model]),
            ctx,
        )  # fmt: skip
        stats = next((m for m in reading.models if m.name == target.engine_model), None)
        if stats is None:
            return None
        kv, waiting = stats.kv_cache_usage, stats.requests_waiting
        seen = f"target KV cache {'?' if kv is None else f'{kv:.0%}'}, queue " + (
            "?" if waiting is None else f"{waiting:g}"
        )
        if kv is not None and kv > KV_FULL:
            return False, f"{seen}: no room (KV over {KV_FULL:.0%})"
        return True, seen

    async def canary(
        self, target: Upstream, prompt: str, through_measures: bool = False
    ) -> tuple[bool, float | None, str | None]:
        """One small streaming completion straight to the target: (ok, TTFT, error)."""
        assert self.http is not None

        if target.kind == "triton":
            path, body = tri.request(
                {"prompt": prompt, "max_tokens": 4, "stream": True}, False, target.dep,
                target.engine_model,
            )  # fmt: skip
        else:
            path = "/v1/completions"
            body = {"model": target.engine_model, "prompt": prompt, "max_tokens": 4,
                    "stream": True}  # fmt: skip
        started = time.perf_counter()
        ttft = None
        try:
            async with (
                asyncio.timeout(30),
                self.http.post(target.dep.endpoint + path, json=body) as resp,
            ):
                if resp.status != 200:
                    excerpt = await resp.content.read(200)  # not the whole: it may not end
                    raise StepFailed(f"HTTP {resp.status}: {excerpt!r}")
                async for _ in resp.content.iter_any():
                    if ttft is None:
                        ttft = time.perf_counter() - started
        except (aiohttp.ClientError, TimeoutError, StepFailed) as exc:
            if through_measures:
                target.measures.outcomes.add(False)
            return False, None, str(exc) or exc.__class__.__name__
        if through_measures and ttft is not None:
            target.measures.ttft.add(ttft)
            target.measures.outcomes.add(True)
        return ttft is not None, ttft, None if ttft is not None else "no answer"


def _split(
    before: dict[str, int], others: list[Upstream], target: Upstream, pct: int
) -> dict[str, int]:
    """Target gets `pct`; the rest share 100 - pct in their proportions from before."""
    base = {u.id: before.get(u.id, 0) for u in others}
    total = sum(base.values())
    weights = {target.id: pct}
    for uid, w in base.items():
        weights[uid] = 0 if total == 0 else round((100 - pct) * w / total)
    return weights


def _figures(figures: Figures) -> dict[str, Any]:
    return figures.as_dict()


def _breach(figures: dict[str, Any], slo: Any, default_error_rate: float) -> str | None:
    limit = slo.error_rate if slo.error_rate is not None else default_error_rate
    if figures["error_rate"] is not None and figures["error_rate"] > limit:
        detail = figures.get("failures_detail")
        return f"error rate {figures['error_rate']:.1%} over {limit:.1%}" + (
            f" ({detail})" if detail else ""
        )
    ttft, itl = figures["ttft_p95_s"], figures["itl_p95_s"]
    if slo.ttft_p95_ms is not None and ttft is not None and ttft * 1000 > slo.ttft_p95_ms:
        return f"TTFT p95 {ttft * 1000:.0f} ms over {slo.ttft_p95_ms:g} ms"
    if slo.itl_p95_ms is not None and itl is not None and itl * 1000 > slo.itl_p95_ms:
        return f"ITL p95 {itl * 1000:.0f} ms over {slo.itl_p95_ms:g} ms"
    return None


def _figure_text(f: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "?" if v is None else f"{v * 1000:.0f} ms"

    rate = "?" if f["error_rate"] is None else f"{f['error_rate']:.1%}"
    return (
        f"{f['requests']} requests, errors {rate}, TTFT p95 {ms(f['ttft_p95_s'])}, "
        f"ITL p95 {ms(f['itl_p95_s'])}"
    )


async def _first_served(
    plane: DataPlane, model: str, target: Upstream, before: int, timeout: float
) -> float | None:
    """When the data plane sent the target its first request after the cutover
    (monotonic); None if none came within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = await plane.started(model, target.id)
        if now is not None and now > before:
            return time.monotonic()
        await asyncio.sleep(0.002 if plane.kind == BUILTIN else 0.01)
    return None
