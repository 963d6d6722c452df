"""`engineroom drill run NAME [--wait] | list | show ID | what-if ...`: rebuild drills.

A drill runs as a job on the agent of its deployment's node (console.agent.drills.job), so
interrupting this command does not stop it. Exit codes: 0 ok, 1 refused or failed,
2 an agent did not answer, 3 a bad fleet file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from console.commands.agentjob import act
from console.commands.base import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    Command,
    fleet_arg,
    fleet_of,
)
from console.core.config.load import Fleet, MissingSecret
from console.core.safetext import say

if TYPE_CHECKING:  # the rest is imported where it is used: `engineroom --help` does without
    from console.core.snapshot import Job  # httpx and the wire models

WHAT_IF_FLAGS = ("driver", "cuda", "tensorrt", "tensorrt-llm", "gpu", "compute-capability")
# The what-if's verdicts (console.agent.drills.staleness.what_if), as the table says them.
VERDICTS = {
    "serves": "still serves",
    "cache": "serves from cache",
    "rebuild": "REBUILD",  # the engine backend: a new engine, by its drill
    "re-validate": "RE-VALIDATE",  # the PyTorch backend: no build; validated, caches cold
    "unknown": "unknown",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    drills = parser.add_subparsers(dest="verb", required=True)
    run = drills.add_parser("run", help="run a drill on its node's agent (a job)")
    run.add_argument("name")
    run.add_argument("--wait", action="store_true", help="follow the job to its end")
    run.add_argument("--json", action="store_true", help="print the job as JSON")
    listed = drills.add_parser("list", help="the drills in the fleet file, and their history")
    listed.add_argument("--json", action="store_true")
    show = drills.add_parser("show", help="a drill's report (Markdown, or --json)")
    show.add_argument("id", help="the drill's job id")
    show.add_argument("--node", default=None, help="the node that ran it (default: ask all)")
    show.add_argument("--markdown", action="store_true", help="Markdown (the default)")
    show.add_argument("--json", action="store_true")
    whatif = drills.add_parser(
        "what-if", help="which TensorRT-LLM engines an upgrade would make stale"
    )
    for flag in WHAT_IF_FLAGS:
        whatif.add_argument(f"--{flag}", default=None, metavar="VERSION")
    whatif.add_argument("--json", action="store_true")
    for action in drills.choices.values():
        fleet_arg(action)


def run(args: argparse.Namespace) -> int:
    fleet = fleet_of(args)
    if args.verb == "run":
        return run_drill(fleet, args.name, wait=args.wait, as_json=args.json)
    if args.verb == "list":
        return list_drills(fleet, as_json=args.json)
    if args.verb == "show":
        return show_drill(fleet, args.id, node=args.node, as_json=args.json)
    change = {key: getattr(args, key) for key in (f.replace("-", "_") for f in WHAT_IF_FLAGS)}
    return what_if(fleet, change, as_json=args.json)


def drill_node(fleet: Fleet, name: str) -> str | None:
    drill = fleet.drills.get(name)
    found = fleet.deployment(drill.deployment) if drill else None
    return found[1].node if found else None


def run_drill(
    fleet: Fleet, name: str, *, wait: bool, as_json: bool, out: TextIO = sys.stdout
) -> int:
    node = drill_node(fleet, name)
    if node is None:
        known = ", ".join(fleet.drills) or "none"
        print(f"engineroom: {fleet.source}: no drill {name!r} (drills: {known})", file=sys.stderr)
        return EXIT_FAILED
    return asyncio.run(act(fleet, node, lambda a: a.drill(name), wait, as_json, out))


async def _each_agent(
    fleet: Fleet, call: Any
) -> tuple[list[tuple[str, Any]], list[str], dict[str, str]]:
    """`call(actions)` on every node with an agent, at once: (node, answer), the problems,
    and the nodes not asked because their token variable is not set here."""
    from console.collect.clients.actions import ActionError, AgentActions

    async def one(node: str) -> tuple[str, Any]:
        actions = AgentActions(fleet, node)
        try:
            return node, await call(actions)
        finally:
            await actions.close()

    nodes = [n.name for n in fleet.nodes if n.agent is not None]
    answers = await asyncio.gather(*(one(n) for n in nodes), return_exceptions=True)
    rows, problems, no_token = [], [], {}
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, MissingSecret):
            no_token[node] = f"no token ({answer.short})"
        elif isinstance(answer, ActionError):
            problems.append(str(answer))
        elif isinstance(answer, BaseException):
            raise answer
        else:
            rows.append(answer)
    return rows, problems, no_token


def list_drills(fleet: Fleet, *, as_json: bool, out: TextIO = sys.stdout) -> int:
    """The definitions come from the file, so they show with no token at all; the history
    comes from the agents this console holds a token for."""
    from console.core.drills import report as drillreport

    answers, problems, no_token = asyncio.run(_each_agent(fleet, lambda a: a.jobs(200)))
    history: list[tuple[str, Job]] = [
        (node, job) for node, jobs in answers for job in jobs if job.kind == "drill.run"
    ]
    history.sort(key=lambda r: r[1].created or 0, reverse=True)
    if as_json:
        print(
            json.dumps(
                {
                    "drills": [
                        {"name": n, "node": drill_node(fleet, n), **d.model_dump(by_alias=True)}
                        for n, d in fleet.drills.items()
                    ],
                    "history": [
                        {"node": node, **drillreport.report(job, node)} for node, job in history
                    ],
                    "errors": problems,
                    "no_token": no_token,  # node -> why its history was not read
                },
                indent=2,
            ),
            file=out,
        )
    else:
        print(
            f"{'DRILL':<20} {'NODE':<12} {'DEPLOYMENT':<20} {'PIPELINE':<8} "
            f"{'PRECISION':<9} LAST RUN",
            file=out,
        )
        for name, drill in fleet.drills.items():
            last = next((j for _, j in history if j.params.get("drill") == name), None)
            node = drill_node(fleet, name)
            when = "never" if last is None else _last(last)
            if last is None and node in no_token:
                when = f"? {no_token[node]}"  # its node's history was not read
            say(
                f"{name:<20} {node or '?':<12} {drill.deployment:<20} "
                f"{drill.pipeline:<8} {drill.precision:<9} {when}",
                out,
            )
        if history:
            print("\nHISTORY", file=out)
            for node, job in history[:20]:
                rep = drillreport.report(job, node)
                took = rep["time_to_rebuild_s"] or rep["total_s"]
                say(
                    f"  {job.id}  {rep['drill']:<20} {node:<12} {job.state:<10} "
                    f"{'' if took is None else f'{took:.1f} s':>9}  {job.error or ''}",
                    out,
                )
        for problem in problems:
            say(f"engineroom: {problem}", sys.stderr)
    for node, why in no_token.items():
        say(f"engineroom: {node}: history not read: {why}", sys.stderr)
    return EXIT_UNREACHABLE if problems else EXIT_OK


def _last(job: Job) -> str:
    ago = time.time() - (job.updated or job.created or time.time())
    when = f"{ago / 60:.0f} min" if ago < 5400 else f"{ago / 3600:.1f} h"
    return f"{job.state} {when} ago ({job.id})"


def show_drill(
    fleet: Fleet, job_id: str, *, node: str | None, as_json: bool, out: TextIO = sys.stdout
) -> int:
    from console.collect.clients.actions import ActionError, AgentActions
    from console.core.drills import report as drillreport
    from console.core.drills.report_check import ReportError, report_from

    async def find() -> tuple[str, dict[str, Any]] | None:
        for n in fleet.nodes:
            if n.agent is None or (node and n.name != node):
                continue
            actions = AgentActions(fleet, n.name)
            try:
                return n.name, await actions.report(job_id)
            except ActionError as exc:
                if exc.status != 404:
                    say(f"engineroom: {exc}", sys.stderr)
            finally:
                await actions.close()
        return None

    found = asyncio.run(find())
    if found is None:
        print(f"engineroom: no drill job {job_id!r} on any agent", file=sys.stderr)
        return EXIT_FAILED
    where, answer = found
    try:  # the agent's JSON: typed before anything reads it
        rep = report_from(answer)
    except ReportError as exc:
        say(f"engineroom: {where}: drill job {job_id!r}: {exc}", sys.stderr)
        return EXIT_FAILED
    print(json.dumps(answer, indent=2) if as_json else drillreport.markdown(rep), file=out, end="")
    return EXIT_OK


def what_if_rows(fleet: Fleet, change: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every agent's answer for the hypothetical node `change`, asked at once (each judges
    its own TensorRT-LLM engines: console.agent.drills.staleness): the rows, and the
    problems (an agent that did not answer, or was not asked). `rollout plan --what-if`
    selects from the same rows."""
    answers, problems, no_token = asyncio.run(_each_agent(fleet, lambda a: a.what_if(change)))
    problems += [f"{node}: not asked: {why}" for node, why in no_token.items()]
    return [row for _, found in answers for row in found], problems


def what_if(
    fleet: Fleet, change: dict[str, Any], *, as_json: bool, out: TextIO = sys.stdout
) -> int:
    change = {k: v for k, v in change.items() if v is not None}
    if not change:
        print("engineroom: what-if needs at least one of --driver, --cuda, --tensorrt, "
              "--tensorrt-llm, --gpu, --compute-capability", file=sys.stderr)  # fmt: skip
        return EXIT_FAILED
    rows, problems = what_if_rows(fleet, change)
    if as_json:
        print(json.dumps(rows, indent=2), file=out)
    else:
        shown = ", ".join(f"{k} {v}" for k, v in change.items())
        print(f"If the nodes had {shown}:", file=out)
        print(
            f"{'NODE':<12} {'DEPLOYMENT':<20} {'BACKEND':<8} {'VERDICT':<18} "
            f"{'LAST DRILL':>10}  WHY",
            file=out,
        )
        for row in rows:
            verdict = VERDICTS.get(row["verdict"], str(row["verdict"]))
            est = row.get("estimated_rebuild_s")
            say(
                f"{row['node']:<12} {row['deployment']:<20} {row.get('backend') or '?':<8} "
                f"{verdict:<18} {'no drill' if est is None else f'{est:.0f} s':>10}  "
                f"{'; '.join(row.get('why') or []) or '-'}",
                out,
            )
        if not rows:
            print("(no TensorRT-LLM deployments on any agent)", file=out)
        for verdict, what in (("rebuild", "rebuild(s)"), ("re-validate", "re-validation(s)")):
            drills = [r for r in rows if r["verdict"] == verdict]
            if drills:
                total = sum(r.get("estimated_rebuild_s") or 0 for r in drills)
                never = sum(1 for r in drills if r.get("estimated_rebuild_s") is None)
                print(
                    f"{len(drills)} {what}, about {total:.0f} s of drills"
                    + (f" plus {never} never drilled" if never else ""),
                    file=out,
                )
        unknown = sum(1 for r in rows if r["verdict"] == "unknown")
        if unknown:  # neither a rebuild nor safe: said apart, never counted as either
            print(f"{unknown} unknown: see WHY", file=out)
    for problem in problems:
        say(f"engineroom: {problem}", sys.stderr)
    return EXIT_UNREACHABLE if problems else EXIT_OK


COMMAND = Command("drill", "TensorRT-LLM rebuild drills", add_arguments, run)
