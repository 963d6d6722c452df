"""`engineroom jobs [--node N] [--json]`: the jobs of every agent, newest first.
Exit codes: 0 every agent answered, 2 one did not (the others are listed)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, TextIO

from console.commands.base import EXIT_OK, EXIT_UNREACHABLE, Command, fleet_arg, fleet_of
from console.core.config.load import Fleet, MissingSecret
from console.core.safetext import say

if TYPE_CHECKING:  # the rest is imported where it is used: `engineroom --help` does without
    from console.core.snapshot import Job  # httpx and the wire models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("--node", default=None)
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    return run_jobs(fleet_of(args), args.node, as_json=args.json)


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


def run_jobs(
    fleet: Fleet, node: str | None, *, as_json: bool = False, out: TextIO = sys.stdout
) -> int:
    from console.collect.clients.actions import ActionError, AgentActions
    from console.core.snapshot import plain

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


COMMAND = Command("jobs", "the jobs of every agent, newest first", add_arguments, run)
