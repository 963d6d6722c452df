"""One deployment's turn in a rollout (console.gateway.rollouts.runner), phase by phase:

  baseline   the model's weights as they are (what the restore goes back to); its TTFT
             and ITL p95 over a verification window while it still serves (the model's
             `failover.verify_s`; canaries make up what traffic did not give); and the
             TTFT p95 of MIN_SAMPLES canaries straight to it, CANARIES_AT_ONCE at a time;
  drain      a planned failover job drains it (its weight to the others, verified), then
             nothing in flight; one already at weight 0 is waited on until idle;
  stop       (a profile move) its engine stopped through its agent;
  operation  through its agent: engine.restart, vllm.start on the new profile, or the
             drill (drill.run); a standby's start is a vllm.start of its own profile;
  ready      its health check passes, then warm-up requests answer: a round of the
             verify's canaries (at least the model's warm-up);
  verify     the same canaries again (nothing routes to it yet): their TTFT p95 within
             the plan's tolerance of the baseline's canaries (like with like: a window
             under traffic and one of canaries alone do not compare), and the model's SLO;
             a breach is measured again, and halts only when both rounds breach;
  restore    a planned failover job back to the weights from before its turn, each shift
             verified against the SLO; the last window's TTFT and ITL p95, now under
             traffic, are held to the baseline too, and a breach there is measured again
             over one more window before it drains the deployment again.

A phase that fails raises Halt with what and where: the rollout halts with the deployment
as that phase left it, and a resume starts again at that phase. A breach in verify or
restore leaves it at weight 0; a profile move is first started again on the deployment's
own profile, and a resume moves it again; after a restart or a drill, a resume checks it
again from `ready`. Each phase is recorded as it ends, so a gateway killed in the middle
resumes at the phase it was in; an agent job it had asked for is followed again, not asked
for twice.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import aiohttp

from console.core.units import ms_from_seconds
from console.gateway.dataplanes.base import DataPlaneError, DrainTimeout
from console.gateway.failover import targetcheck, verify
from console.gateway.failover.job import Failovers
from console.gateway.failover.weightplan import FailoverRefused, Past
from console.gateway.rollouts.agentcalls import AgentCalls, AgentError
from console.gateway.routing.routetable import RouteTable
from console.gateway.routing.upstream import Upstream, check

READY_DEADLINE_S = 600.0  # an engine healthy after its agent's job said it was
# How long an agent's job may take, by operation, past which the rollout halts (the job
# goes on on the agent, which holds it to its own deadlines).
OPERATION_LIMIT_S = {"restart": 1800.0, "profile": 1800.0, "start-standby": 1800.0,
                     "drill": 6 * 3600.0}  # fmt: skip
SLACK_S = 0.1  # a p95 within 100 ms of its baseline is never a regression (noise)
VERIFY_LOOKS = 2  # canary rounds that must each breach before a step halts

PHASES = {
    "restart": ("baseline", "drain", "operation", "ready", "verify", "restore"),
    "profile": ("baseline", "drain", "stop", "operation", "ready", "verify", "restore"),
    "drill": ("baseline", "drain", "operation", "ready", "verify", "restore"),
    "start-standby": ("operation", "ready"),
}


class RolloutHost(Protocol):
    """What a step uses of the rollouts that run it (console.gateway.rollouts.runner.Rollouts)."""

    table: RouteTable
    failovers: Failovers

    def http(self) -> aiohttp.ClientSession: ...

    def save(self, record: dict[str, Any]) -> None: ...


class Halt(Exception):
    """The rollout stops at this step; str() says what and where."""


def regressed(
    baseline: dict[str, Any] | None, now: dict[str, Any], ratio: dict[str, float]
) -> str | None:
    """Why `now`'s TTFT or ITL p95 is out of tolerance of `baseline`'s, in one line; None
    when within it or where either is unknown (the step's detail says so)."""
    for key, name in (("ttft_p95_s", "TTFT p95"), ("itl_p95_s", "ITL p95")):
        before = baseline.get(key) if baseline else None
        after = now.get(key)
        if before is None or after is None:
            continue
        limit = max(before * ratio[key], before + SLACK_S)
        if after > limit:
            return (
                f"{name} {ms_from_seconds(after)} over {ms_from_seconds(limit)} "
                f"({ratio[key]:g}x its baseline {ms_from_seconds(before)})"
            )
    return None


def compared(baseline: dict[str, Any] | None, now: dict[str, Any]) -> str:
    """The figures held to the baseline, in one line, the unknown ones named."""
    parts = []
    for key, name in (("ttft_p95_s", "TTFT p95"), ("itl_p95_s", "ITL p95")):
        before = baseline.get(key) if baseline else None
        after = now.get(key)
        if before is None or after is None:
            parts.append(f"{name} not compared (unknown {'before' if before is None else 'now'})")
        else:
            parts.append(f"{name} {ms_from_seconds(after)} (baseline {ms_from_seconds(before)})")
    return "; ".join(parts)


class StepRun:
    """The phases of one step of rollout `record` (a plan step's dict, with its state)."""

    def __init__(self, rollouts: RolloutHost, record: dict[str, Any], index: int) -> None:
        self.rollouts = rollouts
        self.record = record
        self.index = index
        self.step: dict[str, Any] = record["steps"][index]
        self.model: str = self.step["model"]
        self.dep: str = self.step["deployment"]
        table = rollouts.table
        self.settings = table.models[self.model]
        self.label = f"rollout {record['id']} step {index + 1}"
        self.why = f"{self.label}: {self.step['operation']} {self.dep}"
        tolerance = record["params"]["plan"]["tolerance"]
        self.ratio = {"ttft_p95_s": float(tolerance["ttft_p95_ratio"]),
                      "itl_p95_s": float(tolerance["itl_p95_ratio"])}  # fmt: skip

    def _save(self) -> None:
        self.rollouts.save(self.record)

    def _upstream(self) -> Upstream:
        found = self.rollouts.table.upstream(self.model, self.dep)
        assert found is not None, f"{self.model}/{self.dep} is not in the route table"
        return found

    async def run(self) -> None:
        step = self.step
        step["state"] = "running"
        step["started"] = step.get("started") or time.time()
        for phase in PHASES[step["operation"]]:
            if phase in step["done"]:
                continue
            step["phase"] = phase
            self._save()
            detail = await getattr(self, "_" + phase)()
            step["done"].append(phase)
            step["details"][phase] = detail
            self._save()
        step["state"], step["phase"], step["ended"] = "done", None, time.time()
        self._save()

    # -- the phases ----------------------------------------------------------------------

    async def _weights(self) -> dict[str, int]:
        plane = await self.rollouts.failovers.plane(self.model)
        try:
            async with asyncio.timeout(10):
                weights = await plane.weights(self.model)
        except (DataPlaneError, TimeoutError) as exc:
            raise Halt(f"data plane {plane.name}: {exc or 'no answer within 10 s'}") from None
        return {u.id: weights.get(u.id, 0) for u in self.rollouts.table.upstreams[self.model]}

    def _canary(self, counted: bool) -> verify.Canary:
        target, http = self._upstream(), self.rollouts.http()
        prompt = self.settings.failover.canary_prompt

        async def one() -> tuple[bool, float | None, str | None]:
            return await targetcheck.canary(http, target, prompt, through_measures=counted)

        return one

    async def _window(self) -> dict[str, Any]:
        """What it serves over a verification window (canaries make up what traffic did not
        give), as a failover's shift is verified."""
        plane = await self.rollouts.failovers.plane(self.model)
        one = self._canary(plane.counts_canaries)
        try:
            return await verify.window(
                plane, self.model, self.dep, self.settings.failover.verify_s, one
            )
        except DataPlaneError as exc:
            raise Halt(f"data plane {plane.name}: {exc}") from None

    async def _canaries(self) -> dict[str, Any]:
        """MIN_SAMPLES canaries straight to it, CANARIES_AT_ONCE at a time: measured the
        same way before its turn and after its operation, so the two compare."""
        results = await verify.canaries(self._canary(False), verify.MIN_SAMPLES)
        failures = sum(1 for ok, _, _ in results if not ok)
        return {
            "requests": len(results),
            "failures": failures,
            "failures_detail": next((e for ok, _, e in results if not ok), None),
            "error_rate": failures / len(results),
            "ttft_p95_s": verify.p95([t for ok, t, _ in results if ok and t is not None]),
            "itl_p95_s": None,  # four-token canaries: no inter-token figure worth a p95
            "source": f"{len(results)} canaries straight to it, "
            f"{verify.CANARIES_AT_ONCE} at a time",
        }

    async def _baseline(self) -> str:
        if self.step.get("weights_before") is None:
            self.step["weights_before"] = await self._weights()
        self.step["baseline"] = served = await self._window()
        self.step["canary_baseline"] = canaries = await self._canaries()
        return (f"weights {self.step['weights_before']}; serving: {verify.text(served)}; "
                f"canaries: TTFT p95 {ms_from_seconds(canaries['ttft_p95_s'])}")  # fmt: skip

    async def _drain(self) -> str:
        weights = await self._weights()
        if weights.get(self.dep, 0) > 0:
            job = await self._failover(drain=self.dep, to=self._drain_to(weights))
            return f"drained by failover job {job}; nothing in flight"
        plane = await self.rollouts.failovers.plane(self.model)
        try:
            await plane.drain(self.model, self.dep, self.settings.failover.drain_timeout_s)
        except DrainTimeout as exc:
            raise Halt(f"drain: {exc}") from None
        except DataPlaneError as exc:
            raise Halt(f"drain: data plane {plane.name}: {exc}") from None
        return "at weight 0 already; nothing in flight"

    def _drain_to(self, weights: dict[str, int]) -> str | None:
        """None: its weight goes to the others that carry traffic, in proportion. Where
        none that is up does (a model whose standby the rollout started), all of it to a
        ready one. Halt where no other is ready: the model's last ready deployment stays."""
        others = [u for u in self.rollouts.table.upstreams[self.model] if u.id != self.dep]
        ready = [u for u in others if u.up]
        if not ready:
            seen = "; ".join(f"{u.id}: {u.reason or 'down'}" for u in others) or "it has none"
            raise Halt(
                f"drain: no other deployment of {self.model} is ready to take its traffic "
                f"({seen}); {self.dep} keeps it: a model's last ready deployment stays in "
                "rotation"
            )
        if any(weights.get(u.id, 0) > 0 for u in ready):
            return None
        return ready[0].id

    async def _stop(self) -> str:
        agent = self._agent()
        engine = await self._call(agent.engine_of(self.dep))
        if engine is None and "stop" not in self.step["agent_jobs"]:
            return f"no engine serves {self.dep} on {self.step['node']}: nothing to stop"
        return await self._agent_job(agent, "stop", {"kind": "engine.stop", "engine": engine})

    async def _operation(self) -> str:
        agent, op = self._agent(), self.step["operation"]
        if op in ("profile", "start-standby"):
            body = {"kind": "vllm.start", "profile": self.step["profile"], "overrides": {}}
        elif op == "drill":
            body = {"kind": "drill.run", "drill": self.step["drill"]}
        else:
            engine = None
            if "operation" not in self.step["agent_jobs"]:
                engine = await self._call(agent.engine_of(self.dep))
                if engine is None:
                    raise Halt(f"no engine serves {self.dep} on {self.step['node']} now "
                               "(its agent's snapshot): nothing to restart")  # fmt: skip
            body = {"kind": "engine.restart", "engine": engine}
        return await self._agent_job(agent, "operation", body)

    async def _ready(self) -> str:
        target, http = self._upstream(), self.rollouts.http()
        deadline = time.monotonic() + READY_DEADLINE_S
        while (problem := await check(http, target, targetcheck.HEALTH_DEADLINE_S)) is not None:
            if time.monotonic() > deadline:
                raise Halt(f"{self.dep} not healthy {READY_DEADLINE_S:g} s on: {problem}")
            await asyncio.sleep(1.0)
        target.mark_up()
        # Warmed the way it is then measured: a round of the verify's canaries, at least the
        # model's warm-up. A fresh vLLM-CPU answered its first rounds of four at once at
        # twice its TTFT from before the restart (CI: 116 and 132 ms against 59 ms).
        warmups = max(self.settings.failover.warmup_requests, verify.MIN_SAMPLES)
        results = await verify.canaries(self._canary(False), warmups)
        failed = [error for ok, _, error in results if not ok]
        if failed:
            raise Halt(f"{len(failed)} of {warmups} warm-up requests to {self.dep} failed: "
                       f"{failed[0]}")  # fmt: skip
        return f"healthy; {warmups} warm-up requests answered"

    async def _verify(self) -> str:
        """Canaries as its baseline's were taken (no traffic reaches it yet), held to that
        baseline and to the model's SLO. A breach is looked at twice before it halts: one
        slow round on a shared host is not a slow engine."""
        before = self.step.get("canary_baseline")
        looks: list[str] = []
        for _ in range(VERIFY_LOOKS):
            figures = await self._canaries()
            self.step["verified"] = figures
            problem = regressed(before, figures, self.ratio) or verify.breach(
                figures, self.settings.slo, self.rollouts.table.fleet.thresholds.error_rate
            )
            if problem is None:
                break
            looks.append(problem)
        else:
            await self._breach(f"canaries after its {self.step['operation']}: "
                               + "; again: ".join(looks))  # fmt: skip
        again = f" (a first look: {looks[0]})" if looks else ""
        baseline = ms_from_seconds((before or {}).get("ttft_p95_s"))
        return (f"{figures['requests']} canaries, errors {figures['error_rate']:.1%}, "
                f"TTFT p95 {ms_from_seconds(figures['ttft_p95_s'])} "
                f"(baseline {baseline}){again}")  # fmt: skip

    async def _restore(self) -> str:
        before = self.step["weights_before"]
        now = await self._weights()
        if {d: before.get(d, w) for d, w in now.items()} == now:
            return f"weights {now} are those from before its turn already"
        job = await self._failover(restore_to=Past(self.label, "running", before, None))
        record = self.rollouts.failovers.job(job) or {}
        windows = [w for w in record.get("verification", []) if w.get("deployment") == self.dep]
        if not windows:
            return f"failover job {job}: weights {before}"
        baseline, last, looks = self.step.get("baseline"), windows[-1], []
        while (problem := regressed(baseline, last, self.ratio)) is not None:
            looks.append(problem)
            if len(looks) == VERIFY_LOOKS:  # a second window under traffic said it too
                await self._failover(drain=self.dep, to=self._drain_to(await self._weights()))
                await self._breach(f"serving again after its {self.step['operation']}: "
                                   + "; again: ".join(looks), drained_again=True)  # fmt: skip
            last = await self._window()
        self.step["served"] = last
        again = f" (a first look: {looks[0]})" if looks else ""
        return f"failover job {job}; {compared(baseline, last)}{again}"

    # -- the parts -----------------------------------------------------------------------

    async def _breach(self, problem: str, drained_again: bool = False) -> None:
        """Halt with the breach, the deployment out of traffic. A profile move goes back to
        the deployment's own profile, and a resume moves it again; after a restart or a
        drill a resume checks it again from `ready` (the operator has looked at it)."""
        self.step["breach"] = problem
        kept = "drained again: it stays out of traffic (weight 0)" if drained_again else (
            "it stays out of traffic (weight 0)")  # fmt: skip
        back = await self._roll_back()
        again = "stop" if self.step["operation"] == "profile" else "ready"
        phases = PHASES[self.step["operation"]]
        self.step["done"] = list(phases[: phases.index(again)])
        if again == "stop":
            self.step["agent_jobs"] = {}
        raise Halt(f"{self.dep}: {problem}; {kept}{back}")

    async def _roll_back(self) -> str:
        if self.step["operation"] != "profile":
            return ""
        dep = next(d for d in self.settings.deployments if d.id == self.dep)
        if dep.profile is None:
            return "; no profile of its own in the fleet file to go back to"
        agent = self._agent()
        try:
            engine = await agent.engine_of(self.dep)
            if engine is not None:
                await agent.run({"kind": "engine.stop", "engine": engine},
                                OPERATION_LIMIT_S["profile"], lambda _: None)  # fmt: skip
            body = {"kind": "vllm.start", "profile": dep.profile, "overrides": {}}
            await agent.run(body, OPERATION_LIMIT_S["profile"], lambda _: None)
        except AgentError as exc:
            return f"; rolling it back to profile {dep.profile} failed: {exc}"
        self.step["rolled_back_to"] = dep.profile
        return f"; rolled back to its own profile {dep.profile}"

    def _agent(self) -> AgentCalls:
        try:
            return AgentCalls(self.rollouts.http(), self.rollouts.table.fleet, self.step["node"])
        except AgentError as exc:
            raise Halt(str(exc)) from None

    @staticmethod
    async def _call(call: Any) -> Any:
        try:
            return await call
        except AgentError as exc:
            raise Halt(str(exc)) from None

    async def _agent_job(self, agent: AgentCalls, phase: str, body: dict[str, Any]) -> str:
        """The agent's job for `phase`, asked for once: a gateway restarted meanwhile
        follows the job it had asked for."""
        limit = OPERATION_LIMIT_S[self.step["operation"]]
        jobs: dict[str, str] = self.step["agent_jobs"]

        def started(job_id: str) -> None:
            jobs[phase] = job_id
            self._save()

        try:
            if phase in jobs:
                job = await agent.follow(jobs[phase], limit)
            else:
                job = await agent.run(body, limit, started)
        except AgentError as exc:
            jobs.pop(phase, None)  # on resume, asked for again
            raise Halt(str(exc)) from None
        return f"agent job {job['id']} ({job.get('kind')}) succeeded"

    async def _failover(self, **move: Any) -> str:
        """A planned failover job of the model, followed to its end; its id."""
        failovers = self.rollouts.failovers
        who = f"rollout {self.record['id']}"
        try:
            job = await failovers.start(self.model, "planned", who, self.why, **move)
        except FailoverRefused as exc:
            raise Halt(f"failover refused: {exc}") from None
        self.step["failover_jobs"].append(job["id"])
        self._save()
        task = failovers.tasks.get(job["id"])
        if task is not None:
            await task
        ended = failovers.job(job["id"]) or {}
        if ended.get("state") != "succeeded":
            raise Halt(f"failover job {job['id']} {ended.get('state')}: {ended.get('error')}")
        return str(job["id"])
