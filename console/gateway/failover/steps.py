"""The steps of one failover job, over the model's data plane.

Every move (all to one deployment, a drain, a restore: console.gateway.failover.weightplan) runs
the same steps:

Planned:
  1. preflight: the data plane can be changed; every deployment that gains traffic answers
     its health check, a canary through it meets the TTFT SLO, and it has room
     (console.gateway.failover.targetcheck);
  2. warm-up: `warmup_requests` requests to each of those that had no traffic;
  3. shift in steps (default 10 %, 50 %, 100 % of the way from the weights before to the
     weights after), each followed by a verification window per gaining deployment
     (console.gateway.failover.verify); a breach rolls back to the weights from before the job and
     fails it with the numbers;
  4. drain: the deployments left at weight 0 take no new request; wait until nothing is in
     flight on them;
  5. done.
Emergency: each gaining deployment's health check, then the weights after at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from console.core.units import ms_from_seconds
from console.gateway.dataplanes.base import BUILTIN, DataPlane, DataPlaneError, DrainTimeout
from console.gateway.failover import targetcheck, verify, weightplan
from console.gateway.failover.weightplan import Move
from console.gateway.routing.routetable import RouteTable
from console.gateway.routing.upstream import Upstream, check


class StepFailed(Exception):
    pass


def step_names(shifts: list[int], mode: str) -> list[str]:
    if mode == "planned":
        return ["preflight", "warmup", *(f"shift {p}%" for p in shifts), "drain", "done"]
    return ["readiness", "shift 100%", "done"]


class JobRun:
    """One job's steps: `job` is its live record, `save` writes it to the store."""

    def __init__(
        self,
        table: RouteTable,
        http: aiohttp.ClientSession,
        plane: DataPlane,
        model: str,
        move: Move,
        job: dict[str, Any],
        save: Callable[[dict[str, Any]], None],
    ) -> None:
        self.table = table
        self.http = http
        self.plane = plane
        self.model = model
        self.move = move
        self.job = job
        self.save = save
        self.label = f"{move.op} {job['id']}"  # the audit's why starts with it

    def _target(self, deployment: str) -> Upstream:
        found = self.table.upstream(self.model, deployment)
        assert found is not None, f"{self.model}/{deployment} is not in the route table"
        return found

    # -- the record of each step ------------------------------------------------------------

    def _step(self, name: str) -> dict[str, Any]:
        step = next(s for s in self.job["steps"] if s["name"] == name)
        step["state"], step["started"] = "running", time.time()
        self.save(self.job)
        return step

    def _done(self, step: dict[str, Any], detail: str) -> None:
        step["state"], step["ended"], step["detail"] = "succeeded", time.time(), detail
        self.save(self.job)

    @staticmethod
    def _fail(step: dict[str, Any], detail: str) -> StepFailed:
        step["detail"] = detail
        return StepFailed(f"{step['name']}: {detail}")

    async def _set(self, weights: dict[str, int], why: str) -> None:
        await self.plane.set_weights(self.model, weights, self.job["who"], why)
        if self.plane.kind != BUILTIN:  # the gateway's routes show what its jobs set elsewhere
            self.table.weights[self.model] = {**self.table.weights[self.model], **weights}

    # -- emergency -------------------------------------------------------------------------

    async def emergency(self) -> None:
        started = time.monotonic()
        step = self._step("readiness")
        targets = [self._target(d) for d in self.move.targets]
        for target in targets:
            problem = await check(self.http, target, targetcheck.HEALTH_DEADLINE_S)
            if problem is not None:
                raise self._fail(step, f"{target.id} is not ready: {problem}")
            target.mark_up()
        names = ", ".join(t.id for t in targets) or "no deployment gains traffic"
        self._done(step, f"{names}: health check passed")
        step = self._step("shift 100%")
        first = targets[0] if targets else None
        served_before = None if first is None else await self.plane.started(self.model, first.id)
        after = weightplan.step(self.move, 100, self.plane.max_weight)
        await self._set(after, f"{self.label}: {self.move.summary}")
        cutover = time.monotonic() - started
        self._done(step, f"weights {after} {ms_from_seconds(cutover)} after start")
        self.job["cutover_s"] = round(cutover, 4)
        step = self._step("done")
        if first is None or served_before is None:
            self.job["first_served_s"] = None
            self._done(step, f"{self.plane.name} does not count requests per deployment")
            return
        when = await verify.first_served(self.plane, self.model, first.id, served_before, 5.0)
        self.job["first_served_s"] = None if when is None else round(when - started, 4)
        self._done(
            step,
            "no request reached the target within 5 s (no traffic?)"
            if when is None
            else f"{first.id} answered its first request {when - started:.3f} s after the command",
        )

    # -- planned ---------------------------------------------------------------------------

    async def planned(self) -> None:
        model = self.table.models[self.model]
        plan, slo = model.failover, model.slo
        timings: dict[str, float] = {}
        t = time.monotonic()
        step = self._step("preflight")
        try:
            detail = await self.preflight(mark_up=True)
        except targetcheck.NotFit as exc:
            raise self._fail(step, str(exc)) from None
        self._done(step, detail)
        timings["preflight_s"] = time.monotonic() - t

        t = time.monotonic()
        step = self._step("warmup")
        cold = [self._target(d) for d in self.move.targets if self.move.before.get(d, 0) == 0]
        for target in cold:
            failures = 0
            for _ in range(plan.warmup_requests):
                ok, _, _ = await targetcheck.canary(self.http, target, plan.canary_prompt)
                failures += 0 if ok else 1
            if failures:
                raise self._fail(
                    step,
                    f"{failures} of {plan.warmup_requests} warm-up requests to {target.id} failed",
                )
        self._done(
            step,
            f"{plan.warmup_requests} requests answered by {', '.join(t.id for t in cold)}"
            if cold
            else "every deployment that gains traffic serves already: nothing to warm up",
        )
        timings["warmup_s"] = time.monotonic() - t

        for pct in plan.steps:
            t = time.monotonic()
            step = self._step(f"shift {pct}%")
            weights = weightplan.step(self.move, pct, self.plane.max_weight)
            await self._set(weights, f"{self.label}: {pct}% of the way ({self.move.summary})")
            windows = await asyncio.gather(
                *(self._window(d, plan.verify_s, plan.canary_prompt) for d in self.move.targets)
            )
            for figures in windows:
                self.job["verification"].append({"step": pct, **figures})
            default = self.table.fleet.thresholds.error_rate
            breach = next(
                (
                    f"{f['deployment']}: {why}" if len(windows) > 1 else why
                    for f in windows
                    if (why := verify.breach(f, slo, default))
                ),
                None,
            )
            if breach:
                await self._roll_back(step, pct, breach)
            self._done(step, "; ".join(verify.text(f) for f in windows) or "weights set")
            timings[f"shift_{pct}_s"] = time.monotonic() - t

        t = time.monotonic()
        step = self._step("drain")
        deadline = time.monotonic() + plan.drain_timeout_s
        left: dict[str, int | None] = {}
        for deployment in self.move.drained:
            try:
                await self.plane.drain(
                    self.model, deployment, max(0.0, deadline - time.monotonic())
                )
            except DrainTimeout as exc:
                left.update(exc.left)
        if left:
            raise self._fail(step, f"still in flight after {plan.drain_timeout_s:g} s: {left}")
        self._done(
            step,
            f"no request in flight on {', '.join(self.move.drained)}"
            if self.move.drained
            else "no deployment left at weight 0: nothing to drain",
        )
        timings["drain_s"] = time.monotonic() - t
        step = self._step("done")
        self.job["timings"] = {k: round(v, 3) for k, v in timings.items()}
        self._done(step, f"{self.model}: {self.move.summary}")

    async def _window(self, deployment: str, seconds: float, prompt: str) -> dict[str, Any]:
        target = self._target(deployment)

        async def one() -> tuple[bool, float | None, str | None]:
            through = self.plane.counts_canaries
            return await targetcheck.canary(self.http, target, prompt, through_measures=through)

        figures = await verify.window(self.plane, self.model, deployment, seconds, one)
        return {"deployment": deployment, **figures}

    async def _roll_back(self, step: dict[str, Any], pct: int, breach: str) -> None:
        why = f"{self.label}: rolled back ({breach})"
        try:
            await self._set(self.move.before, why)
        except DataPlaneError as exc:
            raise self._fail(
                step, f"SLO breached at {pct}%: {breach}; the rollback failed: {exc}"
            ) from None
        self.job["rolled_back"] = True
        raise self._fail(step, f"SLO breached at {pct}%: {breach}; rolled back")

    async def preflight(self, mark_up: bool) -> str:
        """Every gaining deployment fit to take traffic (targetcheck.NotFit otherwise), the
        data plane reachable (DataPlaneError): what was seen, in one line."""
        health = await self.plane.health()
        if not health.ok:
            raise targetcheck.NotFit(f"data plane {self.plane.name}: {health.detail}")
        model = self.table.models[self.model]
        seen = []
        for deployment in self.move.targets:
            target = self._target(deployment)
            ttft, room = await targetcheck.fit(self.http, model, target, mark_up)
            seen.append(
                f"{target.id} healthy and serving; canary TTFT {ms_from_seconds(ttft)}; {room}"
            )
        backends = await self.plane.backends(self.model)
        others = [b.inflight for d, b in backends.items() if d not in self.move.targets]
        now = "?" if any(n is None for n in others) else str(sum(n or 0 for n in others))
        return (
            "; ".join(seen or ["no deployment gains traffic"])
            + f"; in flight on the others {now}; data plane: {self.plane.describe()}"
        )
