"""Failover jobs: move a model's traffic between its deployments without dropping a request.

A job is one move of the model's weights (console.gateway.failover.weightplan): all of it to one
deployment (a fail-back when it undoes the last move), drain one deployment (its weight to
the others in proportion, or to one), or restore the weights from before an earlier job.
Every move runs the same steps, planned or emergency (console.gateway.failover.steps),
with the same verification (console.gateway.failover.verify).

Jobs run in the gateway, so a console that disconnects changes nothing. One job per model
at a time. Every weight change is audited with the job id.

The jobs drive the model's data plane (console.gateway.dataplanes.base): the built-in gateway's
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

from console.gateway.dataplanes.base import BUILTIN, DataPlane, DataPlaneError, plane_class
from console.gateway.dataplanes.builtin import BuiltinPlane
from console.gateway.failover import targetcheck, weightplan
from console.gateway.failover.steps import JobRun, StepFailed, step_names
from console.gateway.failover.weightplan import FailoverRefused, Move, Past
from console.gateway.routing.routetable import RouteTable
from console.gateway.routing.upstream import Upstream

__all__ = ["FailoverRefused", "Failovers", "StepFailed"]

log = logging.getLogger(__name__)

WEIGHTS_DEADLINE_S = 10.0  # reading a data plane's weights to plan a move
HISTORY = 50  # the jobs a fail-back looks back over (and the admin API lists)
ROLLOUT = "rollout"  # the store's kind for a rollout's record (console.gateway.rollouts.runner)


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
        self._planning: set[str] = set()  # models whose job is being planned (weights read)

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

    async def warm(self) -> None:
        """At the gateway's start: start every data plane a model names and read its
        weights, so the routes (and the console's plan) show what it routes by from the
        first answer, not fleet.toml's until a first job. One that cannot be read now is
        left to its first job, which says why."""
        for name, model in self.table.models.items():
            if model.dataplane == BUILTIN:
                continue
            with contextlib.suppress(DataPlaneError, TimeoutError):
                async with asyncio.timeout(WEIGHTS_DEADLINE_S):
                    await self.plane(name)

    # -- bookkeeping -------------------------------------------------------------------

    def settle_interrupted(self) -> None:
        for record in self.table.store.interrupted():
            if record.kind == ROLLOUT:  # a rollout's is console.gateway.rollouts.runner's to settle
                continue
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
        records = [r for r in self.table.store.jobs(HISTORY) if r.kind != ROLLOUT]
        return [j for r in records if (j := self.job(r.id)) is not None]

    def history(self, model: str) -> list[Past]:
        """The model's jobs, newest first, with the weights each found and left."""
        out = []
        for job in self.jobs():
            if job.get("params", {}).get("model") == model:
                out.append(Past(job["id"], job["state"], _weights(job.get("before")),
                                _weights(job.get("after"))))  # fmt: skip
        return out

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

    # -- planning a move ---------------------------------------------------------------

    async def _move(
        self,
        model: str,
        to: str | None = None,
        drain: str | None = None,
        restore_before: str | None = None,
        restore_to: Past | None = None,
    ) -> tuple[DataPlane, Move]:
        """The move asked for, from the data plane's weights now; FailoverRefused (with its
        status) for one that cannot be made. `restore_to`: back to the weights it found (a
        rollout's step, console.gateway.rollouts.runner)."""
        if model not in self.table.models:
            raise FailoverRefused(404, f"no model {model!r}")
        known = [u.id for u in self.table.upstreams[model]]
        for name, value in (("to", to), ("drain", drain)):
            if value is not None and value not in known:
                raise FailoverRefused(
                    404, f"{name}: {model} has no deployment {value!r} ({', '.join(known)})"
                )
        plane = await self.plane(model)
        try:
            async with asyncio.timeout(WEIGHTS_DEADLINE_S):
                before = await plane.weights(model)
        except (DataPlaneError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {WEIGHTS_DEADLINE_S:g} s"
            raise FailoverRefused(503, f"data plane {plane.name}: {why}") from None
        before = {d: before.get(d, 0) for d in known}
        if restore_to is not None:
            return plane, weightplan.restore(model, before, restore_to)
        if restore_before is not None:
            past = next((p for p in self.history(model) if p.id == restore_before), None)
            if past is None:
                raise FailoverRefused(404, f"restore_before: no job {restore_before!r} of {model}")
            return plane, weightplan.restore(model, before, past)
        if drain is not None:
            up = [u.id for u in self.table.upstreams[model] if u.up]
            return plane, weightplan.drain(model, before, drain, to, up)
        assert to is not None
        move = weightplan.fail_back(model, before, to, self.history(model))
        return plane, move or weightplan.all_to(model, before, to)

    # -- starting ----------------------------------------------------------------------

    async def start(
        self,
        model: str,
        mode: str,
        who: str,
        why: str,
        *,
        to: str | None = None,
        drain: str | None = None,
        restore_before: str | None = None,
        restore_to: Past | None = None,
    ) -> dict[str, Any]:
        """Plan the move and start its job; FailoverRefused when it cannot start."""
        if mode not in ("planned", "emergency"):
            raise FailoverRefused(422, f"mode: wants planned or emergency, got {mode!r}")
        self._not_busy(model)
        self._planning.add(model)  # a second ask waits for no weights read: it is refused
        try:
            _, move = await self._move(model, to, drain, restore_before, restore_to)
        finally:
            self._planning.discard(model)
        self._not_busy(model)
        params = {
            "model": model,
            **{k: v for k, v in (("to", to), ("drain", drain),
                                 ("restore_before", restore_before),
                                 ("restore_to", restore_to and restore_to.id)) if v is not None},
            "mode": mode,
            "why": why,
        }  # fmt: skip
        return self._launch(model, move, mode, who, params)

    def _not_busy(self, model: str) -> None:
        if (running := self.running.get(model)) is not None:
            raise FailoverRefused(
                409, f"a failover of {model} is already running (job {running}); wait or cancel"
            )
        if model in self._planning:
            raise FailoverRefused(409, f"a failover of {model} is being planned; wait")

    def _launch(
        self, model: str, move: Move, mode: str, who: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        record = self.table.store.create_job(f"{move.op}.{mode}", who, params)
        plane = self.planes[self.table.models[model].dataplane]
        job: dict[str, Any] = {
            "id": record.id,
            "kind": record.kind,
            "state": "running",
            "who": who,
            "created": record.created,
            "params": params,
            "steps": [
                {"name": s, "state": "pending", "started": None, "ended": None, "detail": None}
                for s in step_names(self.table.models[model].failover.steps, mode)
            ],
            "dataplane": plane.name,
            "dataplane_is": plane.describe(),
            "plan": move.as_dict(),  # what it sets out to do: weights before and after
            "before": None,  # the data plane's weights, read as the job begins
            "after": None,
            "sources": move.sources,
            "verification": [],
            "error": None,
        }
        self.live[record.id] = job
        self.running[model] = record.id
        self._save(job)
        self.tasks[record.id] = asyncio.create_task(self._guard(job, model, move, mode))
        return job

    async def plan(
        self,
        model: str,
        *,
        to: str | None = None,
        drain: str | None = None,
        restore_before: str | None = None,
    ) -> dict[str, Any]:
        """The move and its preflight (health, canary, room of each deployment that gains
        traffic): what the console shows before anyone confirms. Changes no route."""
        plane, move = await self._move(model, to, drain, restore_before)
        assert self.http is not None
        where = {"dataplane": plane.describe(), "figures_from": plane.figures_from(model),
                 **move.as_dict()}  # fmt: skip
        run = JobRun(self.table, self.http, plane, model, move, {"id": "plan"}, lambda _: None)
        try:
            detail = await run.preflight(mark_up=False)
        except targetcheck.NotFit as exc:
            return {"ok": False, "detail": str(exc), **where}
        except DataPlaneError as exc:
            return {"ok": False, "detail": f"data plane {plane.name}: {exc}", **where}
        return {"ok": True, "detail": detail, **where}

    # -- automatic failover ------------------------------------------------------------

    def maybe_auto(self, down: Upstream) -> None:
        """A deployment went down: with auto_failover, drain it onto the healthy ones."""
        model = self.table.models.get(down.model)
        if model is None or not model.auto_failover or down.model in self.running:
            return
        if model.dataplane == BUILTIN:  # its weights are at hand: decide now
            self._auto_from(down, dict(self.table.weights[down.model]))
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
        self._auto_from(down, weights)

    def _auto_from(self, down: Upstream, weights: dict[str, int]) -> None:
        """Drain the dead deployment: its weight to the healthy ones that have weight, in
        proportion; when none has, all of it to the healthy one with the most."""
        model = down.model
        if weights.get(down.id, 0) == 0 or model in self.running or model in self._planning:
            return
        healthy = [u for u in self.table.upstreams[model] if u.up and u.id != down.id]
        if not healthy:
            return
        before = {u.id: weights.get(u.id, 0) for u in self.table.upstreams[model]}
        try:
            move = weightplan.drain(model, before, down.id, None, [u.id for u in healthy])
        except FailoverRefused:  # no healthy one has weight: one takes it all
            best = max(healthy, key=lambda u: before.get(u.id, 0))
            move = weightplan.drain(model, before, down.id, best.id, [best.id])
        params = {"model": model, "drain": down.id, "mode": "emergency",
                  "why": f"{down.id}: {down.reason}"}  # fmt: skip
        self._launch(model, move, "emergency", "auto", params)

    # -- running -----------------------------------------------------------------------

    async def _guard(self, job: dict[str, Any], model: str, move: Move, mode: str) -> None:
        plane: DataPlane | None = None
        try:
            plane = await self.plane(model)
            await plane.begin(model)
            job["before"] = await plane.weights(model)
            assert self.http is not None
            run = JobRun(self.table, self.http, plane, model, move, job, self._save)
            await (run.planned() if mode == "planned" else run.emergency())
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
        if state == "succeeded" and (off := _off_plan(move.after, after)):
            state = "failed"
            error = (f"the data plane routes {off} after the job, not as planned "
                     f"{dict(move.after)}: it did not take every change")  # fmt: skip
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


def _off_plan(planned: dict[str, int], after: dict[str, int] | None) -> dict[str, int]:
    """The deployments whose weight the data plane reads back otherwise than the plan set
    (a drained HAProxy server left drained reads 0); {} where they agree or where the
    weights could not be read (unknown is not a mismatch: the error says why)."""
    if after is None:
        return {}
    return {d: after[d] for d, w in planned.items() if d in after and after[d] != w}


def _weights(value: Any) -> dict[str, int] | None:
    """Weights as a job record holds them; None for anything else."""
    if not isinstance(value, dict):
        return None
    out = {}
    for d, w in value.items():
        if not isinstance(w, int) or isinstance(w, bool):
            return None
        out[str(d)] = w
    return out
