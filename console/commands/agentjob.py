"""A job asked of a node's agent, then followed: what `engineroom vllm` and `engineroom
drill run` share. Interrupting the command stops the following, never the job.
Exit codes: 0 accepted (with --wait: succeeded), 1 refused or failed, 2 no answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from console.commands.base import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from console.core.config.load import Fleet
from console.core.safetext import say

if TYPE_CHECKING:  # the rest is imported where it is used: `engineroom --help` does without
    from console.collect.clients.actions import AgentActions  # httpx and the wire models
    from console.core.snapshot import Job


def print_progress(out: TextIO) -> Callable[[Job], None]:
    printed: set[tuple[str, str]] = set()

    def show(job: Job) -> None:
        for step in job.steps:
            if step.state in ("pending",) or (step.name, step.state) in printed:
                continue
            printed.add((step.name, step.state))
            detail = f": {step.detail}" if step.detail else ""
            say(f"  {step.name:<10} {step.state}{detail}", out)

    return show


async def act(
    fleet: Fleet,
    node: str,
    action: Callable[[AgentActions], Any],
    wait: bool,
    as_json: bool,
    out: TextIO,
) -> int:
    """Ask `node`'s agent for a job (`action`), say what it answered and, with `wait`,
    follow the job to its end; the exit code."""
    from console.collect.clients.actions import ActionError, AgentActions
    from console.core.snapshot import plain
    from console.core.wire import COLD_START_PHASES

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
                    job.id, (lambda j: None) if as_json else print_progress(out)
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
