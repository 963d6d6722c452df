"""Acting on agents: the jobs API from the console and the CLI (no Textual here).

The console never sends a command line: a profile name and overrides, or an engine id.
The agent refuses what its fleet file does not allow; this module reports the refusal
as it came (`ActionError`, with the failed preflight checks when there are some).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from console.collect import apiclient
from console.core.config import ConfigError, Fleet, MissingSecret, Node
from console.core.safetext import say
from console.core.snapshot import Job, job_from, plain
from console.core.wire import COLD_START_PHASES

FINAL = ("succeeded", "failed", "cancelled")
FOLLOW_LIMIT_S = 6 * 3600.0  # past every deadline a job of the agent has (drills: hours)
EXIT_OK, EXIT_FAILED, EXIT_UNREACHABLE = 0, 1, 2


class ActionError(Exception):
    """The agent refused or could not be asked; str() says why, `status` is the HTTP code
    (None when the agent did not answer)."""

    def __init__(self, message: str, status: int | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


class AgentActions:
    """The jobs API of one node's agent."""

    def __init__(self, fleet: Fleet, node: str, timeout: float = 10.0) -> None:
        self.node: Node = fleet.node(node)
        if self.node.agent is None:
            raise ConfigError(
                f"{fleet.source}: node {node!r} has no agent (it is read over SSH): "
                "starting and stopping engines needs the agent"
            )
        headers = {}
        if self.node.token_env:
            index = fleet.nodes.index(self.node)
            token = fleet.secret(self.node.token_env, ("nodes", index, "token_env"))
            headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout  # per call, the whole answer included
        self._client = apiclient.async_client(self.node.agent.rstrip("/"), headers, timeout)

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            status, raw = await apiclient.request(
                self._client, method, path, json=body, deadline_s=self.timeout
            )
        except apiclient.NoAnswer as exc:
            raise ActionError(
                f"{self.node.name}: agent {self.node.agent} did not answer ({exc})"
            ) from None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past what decodes
            data = {"error": raw[:300].decode(errors="replace")}
        if status >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            extra = (
                {k: v for k, v in data.items() if k != "error"} if isinstance(data, dict) else {}
            )
            raise ActionError(f"{self.node.name}: {error or f'HTTP {status}'}", status, **extra)
        return data

    async def whoami(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", "/v1/whoami")
        return result

    async def plan(self, profile: str, overrides: dict[str, Any]) -> dict[str, Any]:
        body = {"kind": "vllm.start", "profile": profile, "overrides": overrides}
        result: dict[str, Any] = await self._call("POST", "/v1/jobs/plan", body)
        return result

    async def start(self, profile: str, overrides: dict[str, Any]) -> Job:
        body = {"kind": "vllm.start", "profile": profile, "overrides": overrides}
        return job_from(await self._call("POST", "/v1/jobs", body))

    async def stop(self, engine: str, restart: bool = False) -> Job:
        kind = "engine.restart" if restart else "engine.stop"
        return job_from(await self._call("POST", "/v1/jobs", {"kind": kind, "engine": engine}))

    async def drill(self, name: str) -> Job:
        return job_from(await self._call("POST", "/v1/jobs", {"kind": "drill.run", "drill": name}))

    async def report(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", f"/v1/jobs/{job_id}/report")
        return result

    async def what_if(self, change: dict[str, Any]) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("POST", "/v1/drills/what-if", change)
        return result

    async def cancel(self, job_id: str) -> Job:
        return job_from(await self._call("DELETE", f"/v1/jobs/{job_id}"))

    async def job(self, job_id: str) -> Job:
        return job_from(await self._call("GET", f"/v1/jobs/{job_id}"))

    async def jobs(self, limit: int = 50) -> list[Job]:
        return [job_from(j) for j in await self._call("GET", f"/v1/jobs?limit={limit}")]

    async def log(self, job_id: str, tail: int = 20) -> list[str]:
        try:
            status, raw = await apiclient.request(
                self._client,
                "GET",
                f"/v1/jobs/{job_id}/log",
                params={"tail": tail},
                deadline_s=self.timeout,
            )
        except apiclient.NoAnswer:
            return []
        return raw.decode(errors="replace").splitlines() if status == 200 else []

    async def follow(
        self,
        job_id: str,
        on_change: Callable[[Job], None],
        interval: float = 0.5,
        limit_s: float = FOLLOW_LIMIT_S,
    ) -> Job:
        """Poll the job until it ends, calling `on_change` whenever it moved. The agent
        holds every job to its own deadlines; `limit_s` bounds the wait should it not."""
        seen: str | None = None
        give_up = time.monotonic() + limit_s
        while True:
            if time.monotonic() > give_up:
                raise ActionError(
                    f"{self.node.name}: job {job_id} still not ended after {limit_s:.0f} s; "
                    f"it goes on on the agent (engineroom jobs --node {self.node.name})"
                )
            job = await self.job(job_id)
            key = json.dumps([job.state, plain(job.steps)], default=str)
            if key != seen:
                seen = key
                on_change(job)
            if job.state in FINAL:
                return job
            await asyncio.sleep(interval)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs; VALUE is read as JSON where it parses (8002, [0,1], true)."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set wants KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(raw)
        except ValueError:
            overrides[key] = raw
    return overrides


# ---------------------------------------------------------------------------------------------
# The CLI: engineroom vllm start|stop|restart, engineroom jobs


# Every column `describe` writes, named: the header and the rows are made together.
JOBS_HEADER = f"{'JOB':<12}  {'KIND':<15} {'TARGET':<20} {'STATE':<10}{'TOOK':>9}  BY / COLD START"


def describe(job: Job) -> str:
    """One line per job for `engineroom jobs` and the follow output (JOBS_HEADER's)."""
    target = job.params.get("profile") or job.params.get("engine") or job.params.get("drill") or ""
    took = f"{job.updated - job.created:7.1f} s" if job.created and job.updated else "?"
    cold = job.result.get("cold_start", {}).get("total_s")
    extra = f"  cold start {cold:.1f} s" if isinstance(cold, int | float) else ""
    return (
        f"{job.id:<12}  {job.kind:<15} {target:<20} {job.state:<10}{took:>9}  by {job.who}{extra}"
    )


def _print_progress(out: TextIO) -> Callable[[Job], None]:
    printed: set[tuple[str, str]] = set()

    def show(job: Job) -> None:
        for step in job.steps:
            if step.state in ("pending",) or (step.name, step.state) in printed:
                continue
            printed.add((step.name, step.state))
            detail = f": {step.detail}" if step.detail else ""
            say(f"  {step.name:<10} {step.state}{detail}", out)

    return show


async def _act(
    fleet: Fleet,
    node: str,
    action: Callable[[AgentActions], Any],
    wait: bool,
    as_json: bool,
    out: TextIO,
) -> int:
    actions = AgentActions(fleet, node)
    try:
        try:
            job: Job = await action(actions)
        except ActionError as exc:
            say(f"engineroom: {exc}", sys.stderr)
            for check in exc.extra.get("checks", []):
                mark = "ok  " if check.get("ok") else "FAIL"
                say(f"  {mark} {check.get('name')}: {check.get('detail')}", sys.stderr)
            return EXIT_UNREACHABLE if exc.status is None else EXIT_FAILED
        if not as_json:
            say(f"job {job.id} ({job.kind}) on {node}: {job.state}", out)
        if wait:
            started = time.monotonic()
            try:
                job = await actions.follow(
                    job.id, (lambda j: None) if as_json else _print_progress(out)
                )
            except asyncio.CancelledError:  # Ctrl+C: this stops following, not the job
                say(
                    f"\nstopped following job {job.id} on {node}; the job goes on in the agent."
                    f"\n  follow it: engineroom jobs --node {node}"
                    f"\n  cancel it: the Jobs screen (c), or DELETE /v1/jobs/{job.id}",
                    sys.stderr,
                )
                raise
            if not as_json:
                say(
                    f"job {job.id}: {job.state} after {time.monotonic() - started:.1f} s"
                    + (f": {job.error}" if job.error else ""),
                    out,
                )
                cold = job.result.get("cold_start")
                if isinstance(cold, dict) and cold.get("total_s") is not None:
                    at = cold["phases"]
                    phases = ", ".join(
                        f"{k} {at[k]:.1f} s" for k in COLD_START_PHASES if at.get(k) is not None
                    )
                    print(f"cold start {cold['total_s']:.1f} s ({phases})", file=out)
                rebuilt = job.result.get("time_to_rebuild_s")
                if isinstance(rebuilt, int | float):
                    print(f"time to rebuild {rebuilt:.1f} s", file=out)
                for line in job.result.get("log_tail", [])[-15:]:
                    say(f"  | {line}", out)
        if as_json:
            print(json.dumps(plain(job), indent=2), file=out)
        return EXIT_OK if job.state in ("succeeded", "running", "queued") else EXIT_FAILED
    except ActionError as exc:
        say(f"engineroom: {exc}", sys.stderr)
        return EXIT_UNREACHABLE if exc.status is None else EXIT_FAILED
    finally:
        await actions.close()


def run_vllm(
    fleet: Fleet,
    verb: str,
    node: str,
    *,
    profile: str | None = None,
    engine: str | None = None,
    sets: list[str] | None = None,
    wait: bool = False,
    as_json: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    if verb == "start":
        assert profile is not None
        overrides = parse_sets(sets or [])
        return asyncio.run(
            _act(fleet, node, lambda a: a.start(profile, overrides), wait, as_json, out)
        )
    assert engine is not None
    restart = verb == "restart"
    return asyncio.run(_act(fleet, node, lambda a: a.stop(engine, restart), wait, as_json, out))


def run_jobs(
    fleet: Fleet, node: str | None, *, as_json: bool = False, out: TextIO = sys.stdout
) -> int:
    async def gather() -> tuple[list[tuple[str, Job]], list[str]]:
        rows: list[tuple[str, Job]] = []
        problems: list[str] = []
        for n in fleet.nodes:
            if (node and n.name != node) or n.agent is None:
                continue
            try:
                actions = AgentActions(fleet, n.name)
            except MissingSecret as exc:  # one node without a token: list the others
                problems.append(f"{n.name}: no token ({exc.short})")
                continue
            try:
                rows += [(n.name, j) for j in await actions.jobs()]
            except ActionError as exc:
                problems.append(str(exc))
            finally:
                await actions.close()
        return rows, problems

    if node:
        fleet.node(node)
    rows, problems = asyncio.run(gather())
    rows.sort(key=lambda r: r[1].created or 0, reverse=True)
    if as_json:
        print(
            json.dumps(
                {
                    "jobs": [{"node": n, **plain(j)} for n, j in rows],
                    "errors": problems,
                },
                indent=2,
            ),
            file=out,
        )
    else:
        print(f"{'NODE':<12} {JOBS_HEADER}", file=out)
        for n, job in rows:
            say(f"{n:<12} {describe(job)}", out)
        for problem in problems:
            say(f"engineroom: {problem}", sys.stderr)
    return EXIT_UNREACHABLE if problems else EXIT_OK
