"""Rollouts (issue 31, docs/rollouts.md): a rollout plan run in the gateway, step by step,
each deployment drained through its model's data plane, acted on through its agent,
verified against its own baseline and given its weight back (console.gateway.rollouts.steps).

The gateway holds the data planes and a SQLite record, and it outlives the console that
started a rollout. One rollout is open at a time. It runs wave by wave. A wave's models go
side by side (at most PARALLEL_MODELS at once); one model's steps in a wave take their
turns in the plan's order (its failover jobs are one at a time), so never more of a
model is out at once than the plan allows. A breach halts the rollout once the wave's
other steps have ended theirs; `current` is the first step not done.

States (`status`): running; paused (at a wave's end, asked for); halted (a step failed or
breached: the deployment stays as that step left it); interrupted (the gateway stopped
while it ran; at the restart each model's weights are read back from its data plane);
succeeded; aborted. Paused, halted and interrupted rollouts resume (the step under way
from the phase it was in) or abort. Every step's end, pause, resume, halt and abort is in
the record's events and the gateway's audit log with who and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp

from console.core.rollouts.plan_file import PlanError, join_problems, parse_plan, to_data
from console.core.rollouts.planner import check_plan
from console.core.sqlitestore import JobState
from console.gateway.dataplanes.base import BUILTIN, DataPlaneError
from console.gateway.failover.job import ROLLOUT, Failovers
from console.gateway.failover.weightplan import FailoverRefused
from console.gateway.rollouts.agentcalls import AgentCalls, AgentError
from console.gateway.rollouts.steps import Halt, StepRun
from console.gateway.routing.routetable import RouteTable

log = logging.getLogger(__name__)

HISTORY = 20  # rollouts the admin API lists
MAX_EVENTS = 200  # a record's events kept (the audit log keeps them all)
OPEN = ("running", "paused", "halted", "interrupted")
PARALLEL_MODELS = 8  # a wave's models stepped at once (each step: canaries, agent jobs)


class Rollouts:
    """The rollouts of one gateway; `failovers.http` must be set before one starts."""

    def __init__(self, table: RouteTable, failovers: Failovers) -> None:
        self.table = table
        self.failovers = failovers
        self.live: dict[str, dict[str, Any]] = {}  # open rollouts, by id
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def http(self) -> aiohttp.ClientSession:
        assert self.failovers.http is not None, "the gateway has not started"
        return self.failovers.http

    # -- the record ----------------------------------------------------------------------

    def save(self, record: dict[str, Any]) -> None:
        record["updated"] = time.time()
        ends: dict[str, JobState] = {"succeeded": "succeeded", "aborted": "cancelled"}
        final = ends.get(record["status"])
        keep = {k: v for k, v in record.items() if k not in ("id", "kind", "who", "params")}
        self.table.store.update_job(record["id"], final or "running", json.loads(json.dumps(keep)))
        if final:
            self.live.pop(record["id"], None)

    def _event(self, record: dict[str, Any], who: str, what: str, why: str = "") -> None:
        record["events"] = [*record["events"], {"time": time.time(), "who": who, "what": what,
                                                "why": why}][-MAX_EVENTS:]  # fmt: skip
        self.table.store.audit(who, f"rollout {what}", {"id": record["id"], "why": why})

    def get(self, rollout_id: str) -> dict[str, Any] | None:
        """The rollout as the admin API answers it (`served`); None if there is none."""
        record = self._record(rollout_id)
        return None if record is None else self.served(record)

    def _record(self, rollout_id: str) -> dict[str, Any] | None:
        if rollout_id in self.live:
            return self.live[rollout_id]
        stored = self.table.store.job(rollout_id)
        if stored is None or stored.kind != ROLLOUT:
            return None
        return {"id": stored.id, "kind": stored.kind, "who": stored.who, "created": stored.created,
                "params": stored.params, **(stored.result or {})}  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        records = self.table.store.jobs(HISTORY, kinds=(ROLLOUT,))
        return [r for s in records if (r := self.get(s.id)) is not None]

    def served(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with each of its models' capacity now, worked out at each read from
        the route table (never stored: a record read back after a restart says now)."""
        plan = (record.get("params") or {}).get("plan") or {}
        models = sorted({str(s.get("model")) for s in record.get("steps") or []})
        capacity = {m: self.capacity(m, plan.get("max_unavailable")) for m in models}
        return {**record, "capacity": capacity}

    def capacity(self, model: str, max_unavailable: Any) -> dict[str, Any]:
        """`ready`: its deployments up and with weight in the route table now; `keeps`: the
        fewest the plan leaves it (its carrying deployments less max_unavailable, never
        none); `deployments`: how many it has. Unknown is None, with why, never 0."""
        declared = self.table.models.get(model)
        found = self.table.upstreams.get(model)
        most_out = max_unavailable if isinstance(max_unavailable, int) else None
        if declared is None or found is None:
            return {"ready": None, "deployments": None, "keeps": None,
                    "max_unavailable": most_out,
                    "unknown": f"{model} is not in the gateway's fleet file now"}  # fmt: skip
        carriers = sum(1 for d in declared.deployments if d.weight > 0)
        keeps = None if most_out is None else max(min(1, carriers), carriers - most_out)
        weights = self.table.weights.get(model, {})
        rotating = [u for u in found if weights.get(u.id, 0) > 0]
        unknown = None
        if declared.dataplane != BUILTIN:  # its weights are that data plane's, not read here
            unknown = f"its data plane {declared.dataplane} holds its weights"
        elif unchecked := [u.id for u in rotating if u.checked is None]:
            unknown = f"not health-checked yet: {', '.join(unchecked)}"
        ready = None if unknown else sum(1 for u in rotating if u.up)
        return {"ready": ready, "deployments": len(found), "keeps": keeps,
                "max_unavailable": most_out, "unknown": unknown}  # fmt: skip

    # -- after a restart -----------------------------------------------------------------

    def settle_interrupted(self) -> None:
        """At the gateway's start: open rollouts come back; one that was running is
        interrupted at its step and phase (nothing runs until it is resumed)."""
        for stored in self.table.store.interrupted():
            if stored.kind != ROLLOUT:
                continue
            record = {"id": stored.id, "kind": stored.kind, "who": stored.who,
                      "created": stored.created, "params": stored.params,
                      **(stored.result or {})}  # fmt: skip
            self.live[stored.id] = record
            if record.get("status") == "running":
                record["status"] = "interrupted"
                cut = []
                for n, step in enumerate(record["steps"]):
                    if step["state"] == "running":
                        step["state"] = "interrupted"
                        cut.append(f"step {n + 1} ({step['deployment']}), phase {step['phase']}")
                at = f" at {'; '.join(cut)}" if cut else ""
                record["error"] = f"the gateway stopped during this rollout{at}"
                self._event(record, "gateway", "interrupted", record["error"])
                self.save(record)

    async def read_weights(self) -> None:
        """Each interrupted rollout's models' weights, read back from their data planes
        (what a resume starts from), into the record's `weights_seen`."""
        for record in list(self.live.values()):
            if record.get("status") != "interrupted":
                continue
            seen: dict[str, Any] = {}
            for model in sorted({s["model"] for s in record["steps"]}):
                seen[model] = await self._weights_now(model)
            record["weights_seen"] = seen
            self.save(record)

    async def _weights_now(self, model: str) -> dict[str, int] | str:
        """The model's weights as its data plane has them, or why they are unknown."""
        if model not in self.table.models:
            return "unknown: the model is no longer in the gateway's fleet file"
        try:
            plane = await self.failovers.plane(model)
            async with asyncio.timeout(10):
                return await plane.weights(model)
        except (DataPlaneError, TimeoutError) as exc:
            return f"unknown: {exc or 'no answer within 10 s'}"

    # -- starting and steering -----------------------------------------------------------

    def start(self, document: dict[str, Any], who: str, why: str) -> dict[str, Any]:
        """Check the plan against the gateway's fleet and start it; FailoverRefused (with
        its status) when it cannot start, saying what and where."""
        if self.live:
            busy = next(iter(self.live.values()))
            raise FailoverRefused(
                409, f"rollout {busy['id']} is {busy['status']}: resume or abort it first"
            )
        try:
            plan = parse_plan(json.dumps(document), Path("plan"))
        except PlanError as exc:
            raise FailoverRefused(422, str(exc)) from None
        fleet = self.table.fleet
        problems = check_plan(plan, fleet)
        problems += self._cannot_reach(sorted({s.node for w in plan.waves for s in w.steps}))
        if problems:
            raise FailoverRefused(422, join_problems(problems))  # six, then how many more
        who = who or "admin"
        record_id = self.table.store.create_job(ROLLOUT, who, {"plan": to_data(plan),
                                                               "why": why}).id  # fmt: skip
        steps = [
            {**s.model_dump(exclude_none=True), "wave": n, "state": "pending", "phase": None,
             "done": [], "details": {}, "agent_jobs": {}, "failover_jobs": [],
             "weights_before": None, "baseline": None, "started": None, "ended": None}
            for n, wave in enumerate(plan.waves, 1) for s in wave.steps
        ]  # fmt: skip
        record: dict[str, Any] = {
            "id": record_id, "kind": ROLLOUT, "who": who, "created": time.time(),
            "params": {"plan": to_data(plan), "why": why}, "status": "running",
            "operation": plan.operation, "current": 0, "steps": steps, "events": [],
            "error": None,
        }  # fmt: skip
        self.live[record_id] = record
        self._event(record, who, "started", why)
        self.save(record)
        self._launch(record)
        return self.served(record)

    def _cannot_reach(self, nodes: list[str]) -> list[str]:
        problems = []
        for node in nodes:
            try:
                AgentCalls(self.http(), self.table.fleet, node)
            except AgentError as exc:
                problems.append(str(exc))
        return problems

    def _open(self, rollout_id: str) -> dict[str, Any]:
        record = self.live.get(rollout_id)
        if record is None:
            ended = self._record(rollout_id)
            if ended is None:
                raise FailoverRefused(404, f"no rollout {rollout_id!r}")
            raise FailoverRefused(409, f"rollout {rollout_id} has ended ({ended.get('status')})")
        return record

    def pause(self, rollout_id: str, who: str, why: str) -> dict[str, Any]:
        record = self._open(rollout_id)
        if record["status"] != "running":
            raise FailoverRefused(409, f"rollout {rollout_id} is {record['status']}, not running")
        record["pause_asked"] = True
        self._event(record, who or "admin", "pause asked", why)
        self.save(record)
        return self.served(record)

    def resume(self, rollout_id: str, who: str, why: str) -> dict[str, Any]:
        record = self._open(rollout_id)
        if record["status"] == "running":
            if not record.pop("pause_asked", False):
                raise FailoverRefused(409, f"rollout {rollout_id} is running already")
        elif rollout_id in self.tasks:  # a pause at its wave's end, not reached yet
            raise FailoverRefused(409, f"rollout {rollout_id} is still ending its step; wait")
        else:
            record["status"], record["error"] = "running", None
            self._launch(record)
        self._event(record, who or "admin", "resumed", why)
        self.save(record)
        return self.served(record)

    async def abort(self, rollout_id: str, who: str, why: str) -> dict[str, Any]:
        """Stop it now. A step under way stops where it is (its failover job cancelled,
        the routes as they are; an agent's job goes on on the agent); the record says which
        deployment was mid-step and the model's weights as its data plane has them."""
        record = self._open(rollout_id)
        task = self.tasks.pop(rollout_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        note = ""
        for step in record["steps"][record["current"] :]:
            if step["state"] in ("running", "interrupted", "halted"):
                step["state"] = "aborted"
                weights = await self._weights_now(step["model"])
                note += (f"; {step['deployment']} was in phase {step['phase']}; "
                         f"{step['model']}'s weights now: {weights}")  # fmt: skip
        record["status"] = "aborted"
        record["error"] = f"aborted by {who or 'admin'}: {why or 'no reason given'}{note}"
        self._event(record, who or "admin", "aborted", why)
        self.save(record)
        return self.served(record)

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    # -- running -------------------------------------------------------------------------

    def _launch(self, record: dict[str, Any]) -> None:
        self.tasks[record["id"]] = asyncio.create_task(self._run(record))

    async def _run(self, record: dict[str, Any]) -> None:
        steps = record["steps"]
        try:
            while record["current"] < len(steps):
                if record.pop("pause_asked", False):
                    record["status"] = "paused"
                    self._event(record, "gateway", "paused", f"before step {record['current'] + 1}")
                    self.save(record)
                    return
                wave = steps[record["current"]]["wave"]
                ends = next((n for n in range(record["current"], len(steps))
                             if steps[n]["wave"] != wave), len(steps))  # fmt: skip
                halts = await self._wave(record, range(record["current"], ends))
                if halts:
                    self._halt(record, halts)
                    return
                record["current"] = ends
                self.save(record)
            record["status"] = "succeeded"
            self._event(record, "gateway", "succeeded")
            self.save(record)
        except asyncio.CancelledError:
            raise  # an abort, or the gateway closing (the record stays open: interrupted)
        except Exception as exc:
            log.exception("rollout %s", record["id"])
            self._halt(record, {record["current"]: f"internal error: {exc!r}"[:300]})
        finally:
            if self.tasks.get(record["id"]) is asyncio.current_task():
                self.tasks.pop(record["id"], None)

    async def _wave(self, record: dict[str, Any], indexes: range) -> dict[int, str]:
        """The wave's steps not done yet: its models side by side, each model's steps in
        turn (a halted one ends its model's turn). The steps that halted, with why, once
        every other step of the wave has ended its own."""
        steps, halts = record["steps"], dict[int, str]()
        by_model: dict[str, list[int]] = defaultdict(list)
        for n in indexes:
            if steps[n]["state"] != "done":
                by_model[steps[n]["model"]].append(n)
        room = asyncio.Semaphore(PARALLEL_MODELS)

        async def turns(ours: list[int]) -> None:
            async with room:
                for n in ours:
                    try:
                        await StepRun(self, record, n).run()
                    except Halt as exc:
                        halts[n] = str(exc)
                        return
                    except Exception as exc:  # a defect: said as this step's halt
                        log.exception("rollout %s step %d", record["id"], n + 1)
                        halts[n] = f"internal error: {exc!r}"[:300]
                        return
                    self._event(record, "gateway", f"step {n + 1} done",
                                f"{steps[n]['operation']} {steps[n]['deployment']}")  # fmt: skip
                    self.save(record)

        await asyncio.gather(*(turns(ours) for ours in by_model.values()))
        return dict(sorted(halts.items()))

    def _halt(self, record: dict[str, Any], halts: dict[int, str]) -> None:
        """Halted at the wave's steps that failed (`halts`: step index -> why)."""
        for n in halts:
            record["steps"][n]["state"] = "halted"
        n, why = next(iter(halts.items()))
        step = record["steps"][n]
        more = f" (and {len(halts) - 1} more step(s) of this wave halted)" if len(halts) > 1 else ""
        record["status"] = "halted"
        record["error"] = f"step {n + 1} ({step['deployment']}): {why}{more}"
        record.pop("pause_asked", None)
        self._event(record, "gateway", "halted", record["error"])
        self.save(record)
