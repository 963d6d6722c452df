"""`engineroom failover MODEL (--to D | --drain D [--to D] | --restore-before JOB)
[--emergency] [--plan] [--wait] [--json]`: one move of a model's weights, a job on the
gateway (docs/gateway.md).

The job runs in the gateway: interrupting this command (or losing the SSH session) does
not stop it. `--plan` shows the move (the weights before and after, per deployment), its
preflight and the model's deployments ranked healthiest first (console.collect
.failover_targets, as the console's failover screen preselects), and starts nothing.
Exit codes: 0 accepted (with --wait: succeeded; with --plan: the preflight passed), 1
refused or failed, 2 the gateway did not answer, 3 a bad fleet file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from console.commands.base import EXIT_USAGE, Command, fleet_arg, fleet_of
from console.core.config.load import ConfigError, Fleet
from console.core.safetext import say

if TYPE_CHECKING:  # imported where it is used: `engineroom --help` does without httpx
    from console.collect.clients.gateway_client import GatewayError
    from console.core.gateway_wire import FailoverJob

CALL_DEADLINE_S = 15.0  # one admin call, whole answer included
POLL_S = 0.3  # --wait: how often the job is read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet_arg(parser)
    parser.add_argument("model")
    parser.add_argument(
        "--to", metavar="DEPLOYMENT", help="all of the model there (with --drain: D's weight)"
    )
    move = parser.add_mutually_exclusive_group()
    move.add_argument(
        "--drain", metavar="DEPLOYMENT", help="its weight to 0, spread over the others"
    )
    move.add_argument(
        "--restore-before", metavar="JOB", help="the weights from before that gateway job"
    )
    parser.add_argument("--emergency", action="store_true", help="all weight at once")
    parser.add_argument(
        "--plan", action="store_true", help="show the weights before and after and the "
        "preflight; start nothing",
    )  # fmt: skip
    parser.add_argument("--why", default="", help="recorded in the audit log")
    parser.add_argument("--wait", action="store_true", help="follow the job to its end")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    no_move = args.to is None and args.drain is None and args.restore_before is None
    if no_move and not args.plan:
        print("engineroom failover: name the move: --to, --drain or --restore-before "
              "(--plan alone proposes the healthiest --to)", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    if args.restore_before is not None and args.to is not None:
        print("engineroom failover: --restore-before takes no --to", file=sys.stderr)
        return EXIT_USAGE
    return run_failover(
        fleet_of(args),
        Ask(args.model, args.to, args.drain, args.restore_before),
        emergency=args.emergency,
        why=args.why,
        wait=args.wait,
        as_json=args.json,
        plan=args.plan,
    )


def _show(job: FailoverJob, printed: set[tuple[str, str]], out: TextIO) -> None:
    for step in job.steps:
        key = (step.name, step.state)
        if step.state == "pending" or key in printed:
            continue
        printed.add(key)
        detail = f": {step.detail}" if step.detail else ""
        say(f"  {step.name:<12} {step.state}{detail}", out)


def _wait_limit(fleet: Fleet, model: str) -> float:
    """How long --wait follows a job: every step's verification window, the warm-up and
    the drain, with a margin; past it the job goes on in the gateway and we say so."""
    plan = next((m.failover for m in fleet.models if m.name == model), None)
    if plan is None:
        return 600.0
    return len(plan.steps) * (plan.verify_s + 30) + plan.drain_timeout_s + 120


@dataclass(frozen=True, slots=True)
class Ask:
    """The move asked for: `to` alone (all there), `drain` (onto `to` when given), or
    `restore_before` (a gateway job's id)."""

    model: str
    to: str | None = None
    drain: str | None = None
    restore_before: str | None = None

    def what(self) -> str:
        if self.restore_before is not None:
            return f"{self.model}: restore the weights from before job {self.restore_before}"
        if self.drain is not None:
            onto = f" onto {self.to}" if self.to else " onto the others"
            return f"{self.model}: drain {self.drain}{onto}"
        return f"{self.model} -> {self.to}"


def run_failover(
    fleet: Fleet,
    ask: Ask,
    *,
    emergency: bool = False,
    why: str = "",
    wait: bool = False,
    as_json: bool = False,
    plan: bool = False,
    out: TextIO = sys.stdout,
) -> int:
    if fleet.gateway is None:
        raise ConfigError(f"{fleet.source}: no [gateway] section: failovers run in the gateway")
    if not any(m.name == ask.model for m in fleet.models):
        say(f"engineroom: failover: {ask.model!r} is not a model of {fleet.source}", sys.stderr)
        return 1
    if plan:
        return asyncio.run(_plan(fleet, ask, as_json, out))
    mode = "emergency" if emergency else "planned"
    return asyncio.run(_run(fleet, ask, mode, why, wait, as_json, out))


def _refused(exc: GatewayError, what: str) -> int:
    """Say why the gateway did not do `what`; the exit code."""
    if exc.status is None:
        say(f"engineroom: the gateway did not answer: {exc.reason}", sys.stderr)
        return 2
    if exc.status < 400:  # an answer, but not the one asked for: say what came
        say(f"engineroom: the gateway answered {exc.reason}", sys.stderr)
        return 2
    say(f"engineroom: {what} refused: {exc.reason}", sys.stderr)
    return 1


def weights_lines(before: dict[str, int], after: dict[str, int], sources: list[str],
                  targets: list[str]) -> list[str]:  # fmt: skip
    """The plan's weights, one deployment a line: before -> after, and its part."""
    width = max((len(d) for d in after), default=10)
    lines = []
    for deployment, weight in after.items():
        part = ("gains traffic (verified)" if deployment in targets
                else "loses traffic" if deployment in sources else "")  # fmt: skip
        was = before.get(deployment, 0)
        lines.append(f"  {deployment:<{width}}  {was:>4} -> {weight:<4} {part}".rstrip())
    return lines


def _show_move(plan: dict[str, Any] | None, out: TextIO) -> None:
    if not plan or not isinstance(plan.get("weights_after"), dict):
        return
    say(f"move: {plan.get('summary') or plan.get('op')}", out)
    sources = plan.get("sources") or []
    say(f"source: {', '.join(sources) if sources else 'none'}", out)
    say("weights before -> after:", out)
    for line in weights_lines(plan.get("weights_before") or {}, plan["weights_after"],
                              sources, plan.get("targets") or []):  # fmt: skip
        say(line, out)


async def _plan(fleet: Fleet, ask: Ask, as_json: bool, out: TextIO) -> int:
    from console.collect.clients.gateway_client import GatewayClient, GatewayError
    from console.collect.moves.failover_targets import preselected, rank
    from console.collect.views.check import poll_once

    model = next(m for m in fleet.models if m.name == ask.model)
    view, _, gateway, _ = await poll_once(fleet)
    snapshot = gateway.snapshot.routes(ask.model) if gateway.snapshot is not None else None
    exclude = [d for d in (ask.drain,) if d is not None]
    ranked = rank(model, view.models.get(ask.model, []), snapshot, exclude)
    if ask.to is None and ask.drain is None and ask.restore_before is None:
        if not ranked or not ranked[0].ready:
            say(f"engineroom: failover --plan: {preselected(ranked)}", sys.stderr)
            return 1
        ask = Ask(ask.model, to=ranked[0].id)
    client = GatewayClient(fleet, timeout=CALL_DEADLINE_S + 30)  # the preflight's canary
    try:
        try:
            result = await client.plan(ask.model, ask.to, drain=ask.drain,
                                       restore_before=ask.restore_before)  # fmt: skip
        except GatewayError as exc:
            return _refused(exc, "the plan")
    finally:
        await client.close()
    if as_json:
        answer = {**result.model_dump(mode="json"), "candidates": [c.__dict__ for c in ranked]}
        print(json.dumps(answer, indent=2), file=out)
        return 0 if result.ok else 1
    say(f"plan: {ask.what()} (nothing is changed)", out)
    _show_move(result.model_dump(), out)
    say(f"preflight {'ok' if result.ok else 'FAILED'}: {result.detail}", out)
    if result.figures_from:
        say(f"verification figures: {result.figures_from}", out)
    say(f"targets, healthiest first ({preselected(ranked)}):", out)
    for c in ranked:
        say(f"  {c.id}: {c.why}", out)
    return 0 if result.ok else 1


async def _run(
    fleet: Fleet, ask: Ask, mode: str, why: str, wait: bool, as_json: bool, out: TextIO
) -> int:
    from console.collect.clients.gateway_client import GatewayClient, GatewayError
    from console.core.gateway_wire import JOB_FINAL

    client = GatewayClient(fleet, timeout=CALL_DEADLINE_S)
    try:
        try:
            job = await client.failover(ask.model, ask.to, mode, why, drain=ask.drain,
                                        restore_before=ask.restore_before)  # fmt: skip
        except GatewayError as exc:
            return _refused(exc, "failover")
        if not as_json:
            say(f"job {job.id} ({job.kind}) {ask.what()}: running", out)
            _show_move(job.plan, out)
        printed: set[tuple[str, str]] = set()
        limit = _wait_limit(fleet, ask.model)
        give_up = time.monotonic() + limit
        while wait and job.state not in JOB_FINAL:
            if time.monotonic() > give_up:
                say(
                    f"engineroom: job {job.id} still {job.state} after {limit:.0f} s; "
                    f"it goes on in the gateway (engineroom jobs, or GET /admin/jobs/{job.id})",
                    sys.stderr,
                )
                return 1
            await asyncio.sleep(POLL_S)
            try:
                job = await client.job(job.id)
            except GatewayError as exc:
                what = "did not answer" if exc.status is None else "answered"
                say(f"engineroom: job {job.id}: the gateway {what} {exc.reason}", sys.stderr)
                return 2
            if not as_json:
                _show(job, printed, out)
    finally:
        await client.close()
    if as_json:
        print(json.dumps(job.model_dump(mode="json"), indent=2), file=out)
    elif wait:
        error = f": {job.error}" if job.error else ""
        say(f"job {job.id}: {job.state}{error}", out)
        say(f"routes before {job.before}  after {job.after}", out)
    return 0 if job.state in ("succeeded", "running") else 1


COMMAND = Command(
    "failover",
    "move a model's traffic: all to one deployment, drain one, restore earlier weights",
    add_arguments,
    run,
    description="One move of a model's weights, run as a job on the gateway: --to X "
    "(all to X; a fail-back when it undoes the last move), --drain D (D's weight to the "
    "others in proportion, or to --to), or --restore-before JOB (docs/gateway.md).",
)
